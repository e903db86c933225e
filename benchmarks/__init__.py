"""The timing benchmarks (pytest-benchmark): `pytest benchmarks --benchmark-only`.

A package, so that its modules are `benchmarks.test_*` and never clash with the test
suite's modules of the same basename, and share benchmarks.support by import.
"""
