"""Judging a run against other runs: the metrics of an earlier trusted run (`baseline`),
the upgrade gate that pairs another dump's calls with a baseline's and says what regressed
(`upgrade`), and the verdict of a kernel pooled over every call of it in a step
(`kernel_verdicts`), which both compare.

May import: judge/verdict, judge/check.
"""
