"""Helpers for testing the plugin and measuring it: dumps written from real tensors and
planted faults, shared by the repository's tests, studies and benchmarks, as
numpy.testing and torch.testing are shipped with their libraries.

Shipped with the package so that a study or benchmark imports them by name after
`pip install -e .` (no `sys.path` edits), and a user can plant the same faults in a
check of their own:

    dumpwriter      DumpWriter: msprobe's dump.json and tensor files from real tensors
    faults          scaled_in: an API made wrong only in the dtype under test
    model_faults    faulty kernels modelled on defects real accelerators have shown
    explore_faults  naive kernels that only exploration's edge inputs trip
    moe_dump        one MoE training step recorded as MindSpeed runs it on an NPU
    upgrade_dumps   dump pairs "before" and "after" an operator upgrade

May import: torch, the standard library, `pytest_msprobe.bench_functions` (the NPU fused
operators' CPU references) and itself; never pytest, and no stage of the plugin imports
it (tests/repository/test_package_layout.py checks both).
"""
