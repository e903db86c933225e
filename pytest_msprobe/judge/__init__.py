"""Judging a call, one subpackage per feature, from the core up; a feature imports only
from itself and the features before it in this list (tests/repository/test_package_layout.py checks this,
`TYPE_CHECKING` imports aside):

    verdict/   what a verdict is made from (`judgement`: Judgement and the ordered
               re-judgements, RE_JUDGEMENTS), the arithmetic it reads (an element's
               terms, groups that share a normaliser, rounding once, summed routes, the
               rows a grouped kernel wrote) and the result as plain data (`record`)
    offline/   the dump's own outputs as the device's result (`dumped_run`), the memory
               layouts a device may have used, and the gradients autograd summed over
               several readers (`summed_gradients`, their bound in `missing_shares`)
    findings/  the checks beside the standards: the device's bits over repeated runs,
               the re-check of a dumped inf/NaN, the device's overflow mode
    defects/   the known defects of the libraries the plugin runs (`table`: one row each,
               its regime, its measured symptom, its reproducer; `python -m
               pytest_msprobe.judge.defects.reproduce ROW` runs one without the plugin)
    check/     one call end to end (`call`: read, replay, judge), what any outcome
               amounts to (`outcome`), the samples an HTML report plots, the check of a
               registry's routes before any call
    explore/   --msprobe-explore: the search around a call (hypothesis) and what excuses
               an example it finds (the overflows and the rounding no correct kernel avoids)
    reduce/    a failing call cut down to a smaller input that fails the same way
    gate/      a recorded baseline, the upgrade gate over two dumps, kernel verdicts pooled
               over every call of a kernel

May import: `dump`, `run`, `errors`, `private_apis`, `standards`, `bench_functions`.
Never pytest, never a later stage.
"""
