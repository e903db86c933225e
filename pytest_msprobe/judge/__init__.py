"""Judging a call: the check end to end (`call`: read, replay, judge), what a verdict
is made from and the ordered table of ways a call judged error is judged again
(`judgement`: Judgement, RE_JUDGEMENTS; one more way of judging is one more row), the
references a call may be judged against besides the bench (`offline`: the dump's own
outputs as the device result, with the sums of gradients autograd added over several
readers (`shared_sums`, its arithmetic in `shares`); `baseline`: a recorded run's metrics;
`upgrade`: another dump of the model paired with a baseline's calls, and what regressed),
the result as plain data (`record`), what any outcome amounts to (`outcome`), and the
check of a standards registry's routes and thresholds before any call (`routing`),
the element samples an HTML report plots (`samples`), and the checks beside the
standards (`findings`): the device's bits over repeated runs (`repeat`) and the
overflow re-check of dumped inf/NaN (`overflow`); and the search around a call
(`explore`: --msprobe-explore, hypothesis) with what excuses or names an example it
finds: the rounding a correct kernel may reach (`sensitivity`), the overflows none
avoids (`excuses`, over a backward's intermediates: `intermediates`); and the known
defects of the libraries the plugin runs (`defects`: one table, each row's regime in
`regimes`, its measured symptom in `symptoms`, its reproducer in `reproducers` and
`reproducers_reduced`, run by `python -m pytest_msprobe.judge.reproduce`), which a
failure's message names; and the reduction of a failing call to a smaller input that
fails the same way (`reduce`), the plugin's verdict its oracle.

May import: `dump`, `run`, `errors`, `compat`, `standards`. Never pytest, never a later stage.
"""
