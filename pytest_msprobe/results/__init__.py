"""Results on disk: the writer of a run's files (`run_files`: journal, details, metrics,
the run file), msprobe's CSV formats (`msprobe_csv`), the terminal summary (`summary`),
merging the files of several runs (`merge`, the msprobe-merge command), saving a failed
call's data (`failed_data`), and the HTML report (`html_page`, the msprobe-report command,
with its page `report.html`, the plots of element samples `elements` and their
matplotlib figures `plots`).

May import: `dump`, `run`, `judge`, `errors`, `standards`. Never pytest, never `scripts`
or `plugin`.
"""
