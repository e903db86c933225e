"""Running a call: resolving its API through the tables (`apis`, `api_tables/`), the
device backends (`devices`), replay on the device, the raised-precision bench and the
reference (`replay`), MindSpore calls (`mindspore/`), and keeping a call's hang, OOM
or crash its own (`isolation`).

May import: `dump`, `errors`, `bench_functions`. Never pytest, never a later stage.
"""
