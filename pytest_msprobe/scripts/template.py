"""The text of a standalone script (see scripts.py, which fills it in).

Kept as one template so that what the kernel engineer reads is visible here as they
will read it: the short part they edit on top, the support code at the bottom.
Placeholders are `string.Template` ones ($name); every value is a Python literal or a
comment made safe by the generator.
"""

from string import Template

SCRIPT = Template('''\
#!/usr/bin/env python3
# Reproduces one call of an msprobe dump, judged as pytest-msprobe judges it:
#
#     $call_comment
#
# dump:  $dump_comment
# test:  $judged_comment
#
#     python $file_comment                       # the test's direction, on the best device here
#     python $file_comment --device cpu --seeds 3
#     python $file_comment --help
#
# Needs torch only ($needs_comment): not the model, the dump's other calls, or pytest-msprobe.
# Edit freely above the support code: the call (call_api), its records (a shape, a
# statistic, an argument), how its inputs are built.
"""Standalone reproduction of one msprobe dump call (written by pytest-msprobe $version)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

CALL = $call
FRAMEWORK = $framework
# "tensor": the inputs are the dumped tensors, read from DUMP_DIR/dump_tensor_data/
# (--dump-dir if the dump moved); "statistics": they are generated from the statistics
# in the records below.
TASK = $task
DUMP_DIR = $dump_dir
MAX_ELEMENTS = $max_elements  # tensors above this many elements are refused, as in the test
# Routes and thresholds of the --msprobe-standards file of the test (None: the shipped tables).
STANDARDS_CSV = $standards_csv
# Why this call cannot be replayed at all (None: it can).
CANNOT_RUN = $cannot_run

# The call's records in dump.json. Generated inputs follow each tensor's "dtype", "shape"
# and Max/Min/Mean: edit them to try a smaller or another case (with --generate for a
# tensor dump, whose files keep their recorded shapes).
FORWARD_RECORD = $forward
BACKWARD_RECORD = $backward


$call_api


def build_inputs(direction: str, dump_dir: Path, generate: bool, variant: int):
    """The call's arguments, decoded from the records exactly as the test decoded them:
    tensor files (loaded safely), or tensors generated from the statistics with the
    test's seed, which depends on the call id and the argument's place. A variant > 0
    draws other seeds. To try inputs of your own, return
    Inputs(args, kwargs, leaves) (from _msprobe_support.run.replay) built by hand."""
    from _msprobe_support.dump.index import TENSOR_FOLDER
    from _msprobe_support.dump.values import DecodeContext
    from _msprobe_support.run.replay import decode_backward, decode_forward

    call_id = CALL.rsplit(".", 1)[0]
    if variant:
        call_id += f" (seed variant {variant})"
    ctx = DecodeContext(dump_dir / TENSOR_FOLDER, "statistics" if generate else TASK, call_id, MAX_ELEMENTS)
    if direction == "forward":
        return decode_forward(FORWARD_RECORD, ctx)
    return decode_backward(FORWARD_RECORD, BACKWARD_RECORD, ctx)


def main() -> int:
    _unpack_support()
    from _msprobe_support.scripts.runtime import ScriptCall, main as run_script

    call = ScriptCall(CALL, FRAMEWORK, TASK, DUMP_DIR, BACKWARD_RECORD is not None, MAX_ELEMENTS, build_inputs,
                      call_api, standards_csv=STANDARDS_CSV, cannot_run=CANNOT_RUN)
    return run_script(call, sys.argv[1:])


# =====================================================================================
# Support code, generated from pytest-msprobe $version: do not edit.
#
# pytest-msprobe's own replay, input decoding and generation, devices and precision
# standards (with their tables), so that this script judges the call with the very
# code its test used. It is unpacked into a temporary folder as the private package
# `_msprobe_support` while the script runs; it never imports pytest-msprobe.
# =====================================================================================


def _unpack_support() -> None:
    import atexit
    import os
    import shutil
    import tempfile

    root = tempfile.mkdtemp(prefix="msprobe-script-")
    atexit.register(shutil.rmtree, root, True)
    for relative, text in _SUPPORT_FILES.items():
        path = os.path.join(root, "_msprobe_support", *relative.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
    sys.path.insert(0, root)


_SUPPORT_FILES = {
$support_files
}


if __name__ == "__main__":
    sys.exit(main())
''')

# How the call is made, per kind of call; $expression is a checked torch attribute path.
TORCH_CALL = Template('''\
def call_api(*args, **kwargs):
    """The call under test, run on the device in the dump's dtypes and on the CPU bench
    at raised precision. Change it here (an argument, an environment variable, another
    implementation) to experiment."""
    return $expression(*args, **kwargs)''')

RESOLVED_CALL = Template("""\
# $call_comment is resolved as the test resolves it:
$how
# Set call_api to a function of (*args, **kwargs) to run that on both sides instead.
call_api = None""")

NOT_RUNNABLE_CALL = """\
# This call cannot be replayed (see CANNOT_RUN above).
call_api = None"""
