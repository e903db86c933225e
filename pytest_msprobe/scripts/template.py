"""The text of a standalone script and of the judging library beside it (see standalone.py
and shared.py, which fill them in).

Kept as templates so that what the kernel engineer reads is visible here as they will
read it: the call, its inputs and the verdict to expect on top, then the few lines that
find the judging library. Placeholders are `string.Template` ones ($name); every value
is a Python literal or a comment made safe by the generator.
"""

from string import Template

SCRIPT = Template('''\
#!/usr/bin/env python3
# Reproduces one call of an msprobe dump, judged as pytest-msprobe judges it:
#
#     $call_comment
#
# dump:      $dump_comment
# expected:  $expected_comment
$inputs_comment
#
#     python $file_comment                       # the test's direction, on the best device here
#     python $file_comment --device cpu --seeds 3
#     python $file_comment --help
#
# Needs torch ($needs_comment) and, for the judging, pytest-msprobe installed or
# _msprobe_judge.py beside this script (written with it): not the model, the dump or
# pytest. Edit freely: the call (call_api), its records (a shape, a statistic, an
# argument), its decoded inputs (build_inputs).
"""Standalone reproduction of one msprobe dump call (written by $library_comment)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

CALL = $call
FRAMEWORK = $framework
# "tensor": the inputs are the dumped tensors, from TENSORS; "statistics": they are
# generated from the statistics in the records below, with the test's seeds.
TASK = $task
# True: the dumped outputs are the device result, as in the test's --msprobe-offline run.
OFFLINE = $offline
# The call's dumped tensors, in a file beside this script (None: it has none), loaded
# with torch.load(weights_only=True); --dump-dir reads them from a dump folder instead.
TENSORS = $tensors
DUMP_DIR = $dump_dir  # where the dump was when this script was written
MAX_ELEMENTS = $max_elements  # tensors above this many elements are refused, as in the test
# Routes and thresholds of the --msprobe-standards file of the test (None: the shipped tables).
STANDARDS_CSV = $standards_csv
# Why this call cannot be replayed at all (None: it can).
CANNOT_RUN = $cannot_run
# The test's verdict, which this script's is compared with (None: written without running it).
EXPECTED = $expected
# The judging library this script was written with: pytest-msprobe or _msprobe_judge.py.
LIBRARY = $library

# The call's records in dump.json. Generated inputs follow each tensor's "dtype", "shape"
# and Max/Min/Mean: edit them to try a smaller or another case (with --generate for a
# tensor dump, whose files keep their recorded shapes).
FORWARD_RECORD = $forward
BACKWARD_RECORD = $backward


$call_api


def build_inputs(direction: str, inputs):
    """The inputs as the test decoded them (.args, .kwargs, .grads: the incoming
    gradients of a backward): change them here to experiment, e.g. inputs.args[1] = 0.5."""
    return inputs


def main() -> int:
    runtime = judging_library()
    call = runtime.ScriptCall(
        CALL, FRAMEWORK, TASK, OFFLINE, Path(__file__).resolve().parent, TENSORS, DUMP_DIR, FORWARD_RECORD,
        BACKWARD_RECORD, MAX_ELEMENTS, call_api, build_inputs, STANDARDS_CSV, CANNOT_RUN, EXPECTED,
    )
    return runtime.main(call, sys.argv[1:])


def judging_library():
    """pytest-msprobe's script runtime: the installed package where it is the library
    this script was written with (or where no _msprobe_judge.py is beside it), else
    the module beside it."""
    beside = Path(__file__).resolve().with_name("_msprobe_judge.py")
    try:
        from pytest_msprobe.scripts import shared
    except ImportError:
        shared = None
    if shared is not None and (not beside.is_file() or shared.identity() == LIBRARY):
        return shared.runtime_for(LIBRARY)
    if not beside.is_file():
        sys.exit(f"{CALL}: judging needs pytest-msprobe installed (pip install pytest-msprobe) or "
                 f"_msprobe_judge.py beside this script (from the folder it was written in)")
    import importlib.util

    spec = importlib.util.spec_from_file_location("_msprobe_judge", beside)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.runtime_for(LIBRARY)


if __name__ == "__main__":
    sys.exit(main())
''')

# How the call is made, per kind of call; $expression is a checked torch attribute path.
TORCH_CALL = Template('''\
def call_api(*args, **kwargs):
    """The call under test, run on the device in the dump's dtypes and on the CPU bench
    at raised precision. Change it here (an argument, an environment variable, another
    implementation) to experiment."""
    import torch

    return $expression(*args, **kwargs)''')

RESOLVED_CALL = Template("""\
# $call_comment is resolved as the test resolves it:
$how
# Set call_api to a function of (*args, **kwargs) to run that on both sides instead.
call_api = None""")

NOT_RUNNABLE_CALL = """\
# This call cannot be replayed (see CANNOT_RUN above).
call_api = None"""

# The judging library beside the scripts of a folder: its first line names the library
# (shared.write_shared compares it before writing again).
SHARED_MODULE = Template('''\
IDENTITY = $identity
"""pytest-msprobe's judging library for the standalone scripts of this folder, for a
machine where pytest-msprobe is not installed. Generated: do not edit.

Its stages (input decoding and generation, replay, devices, precision standards and
their tables) are unpacked into a temporary folder as the private package
`_msprobe_support` while a script runs, so that the script judges its call with the
very code its test used; it never imports pytest-msprobe.
"""

import atexit
import importlib
import os
import shutil
import sys
import tempfile

PACKAGE = $package


def runtime_for(expected):
    """The scripts' runtime, unpacked; a note on stderr where a script was written
    with another library (its verdict may then differ from its test's)."""
    if expected != IDENTITY:
        print(f"note: judged by {IDENTITY}, from _msprobe_judge.py; this script was written with {expected}: "
              "its verdict may differ from the test's", file=sys.stderr)
    if PACKAGE not in sys.modules:
        root = tempfile.mkdtemp(prefix="msprobe-script-")
        atexit.register(shutil.rmtree, root, True)
        for relative, text in _FILES.items():
            path = os.path.join(root, PACKAGE, *relative.split("/"))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(text)
        sys.path.insert(0, root)
    return importlib.import_module(PACKAGE + ".scripts.runtime")


_FILES = {
$files
}
''')
