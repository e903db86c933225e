"""Reading the dump: dump.json's streaming index and records (`index`), a recorded
value turned into a Python/torch object (`values`; tensors loaded safely or generated
from statistics in `tensors`), the index cache (`cache`), which calls a run takes
(`filters`: msprobe's lists and dedup), one-call tensor dumps written in msprobe's
format (`tensor_dump`: the examples exploration finds), and what the rest of the dump says
of a call's gradients offline: the module that made it (`module_records`, levels mix
and L0) and which call's output it read (`dataflow`).

May import: `pytest_msprobe.errors`, `pytest_msprobe.private_apis`. Never pytest, never a later stage.
"""

#: the largest tensor (elements) a call may create unless the user says otherwise: a
#: larger one is refused before it is allocated (--msprobe-max-elements, --max-elements)
DEFAULT_MAX_ELEMENTS = 2**28
