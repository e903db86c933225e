"""pytest-msprobe: every API call of an msprobe dump becomes a pytest test.

A call's path, one subpackage per stage; a module imports only from its own stage,
the stages before it, and the shared `errors` and `private_apis` (tests/repository/test_package_layout.py
checks this):

    dump/      reading the dump: the streaming index and records, values, tensors,
               the index cache, which calls a run takes (lists, dedup)
    run/       running a call: API tables, devices, replay on device/bench/reference,
               where the bench runs (precision.py), MindSpore, isolation of hangs,
               OOMs and crashes
    judge/     judging a call, a subpackage per feature: the verdict and its
               arithmetic, offline references, the checks beside the standards, known
               defects, the check end to end and the ResultRecord it amounts to,
               exploration, reduction, baselines and the upgrade gate
    results/   results on disk: the writer, msprobe's CSVs, summary, merge, failed data
    scripts/   standalone scripts that reproduce one call
    plugin/    the pytest layer: options, session state, collection items, and one
               module of hooks per concern (reports, baselines, scale, scripts,
               workers, scheduling); the only stage that imports pytest

`private_apis.py` holds the private APIs of torch, torch_npu, hypothesis and Python that the
stages use (pytest's are in plugin/pytest_privates.py), so that an upgrade that moves one is
changed in one place and named by tests/repository/test_compat.py.

The precision standards (`pytest_msprobe.standards`, from the repository's
`standards/`) and the CPU references of NPU fused ops (`pytest_msprobe.bench_functions`)
are libraries beside the stages: any stage may use them, they use none.
"""
