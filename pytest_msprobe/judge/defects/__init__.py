"""The known defects of the libraries the plugin runs (`table`: DEFECTS, one row each),
which a failure's message names: where each shows (`regimes`, over the float64
`intermediates` a definition computes), its measured symptom (`symptoms`: the failure
disappears when the bench is recomputed the defective way) and its reproducer without the
plugin (`explored_reproducers`, `model_reproducers`), run by
`python -m pytest_msprobe.judge.defects.reproduce ROW`.

May import: judge/verdict.
"""
