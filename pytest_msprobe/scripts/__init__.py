"""Standalone scripts that reproduce one call (`standalone`), from a template (`template`);
the engine they run (`runtime`) comes from the installed package or from the judging
library written once beside them (`shared`). A bug report folder (`bug_report`): a
failing call reduced (judge/reduce/reduction.py), its script, verdicts and environment. The
msprobe-script command (`command`) writes either.

May import: `dump`, `run`, `judge`, `results`, `errors`, `standards`, `bench_functions`.
Never pytest, never `plugin`.
"""
