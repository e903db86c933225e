"""Running a call: resolving its API through the tables (`apis`, `api_tables/`), the
device backends (`devices`), replay on the device, the raised-precision bench and the
reference (`replay`), a dropout's drawn mask (`dropout`), MindSpore calls
(`mindspore/`), keeping a call's hang, OOM or crash its own (`isolation`), and where
the bench runs (`precision`).

May import: `dump`, `errors`, `private_apis`, `bench_functions`. Never pytest, never a later stage.
"""
