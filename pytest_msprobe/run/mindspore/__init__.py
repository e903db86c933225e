"""MindSpore calls: the MindSpore->torch twin table (`tables`, `../api_tables/mindspore.toml`)
and their replay (`replay`). Imported only for dumps whose framework is mindspore.

May import: what `run` may, and `run`'s other modules.
"""
