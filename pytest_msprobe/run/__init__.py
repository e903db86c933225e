"""Running a call: resolving its API through the tables (`apis`, `api_tables/`), the
device backends (`devices`), replay on the device, the raised-precision bench and the
reference (`replay`), MindSpore calls (`mindspore/`), keeping a call's hang, OOM
or crash its own (`isolation`), each element's terms (`terms`), the groups of elements
that share a rounded normaliser (`groups`), where the bench runs
(`precision`), and the inputs around a dumped call that exploration draws
(`neighbourhood`, hypothesis strategies, with the ways it moves a tensor's values:
`moves`), and which dimensions of a call's tensors a reduction may cut together
(`cuts`, the `[reduce]` table).

May import: `dump`, `errors`, `compat`, `bench_functions`. Never pytest, never a later stage.
"""
