"""msprobe's own runner (`msprobe acc_check -api_info dump.json -o OUT`) on a machine
without an accelerator, for benchmarks/test_transformer.py. Run with msprobe's Python:

    python tools/msprobe_acc_check_cpu.py -api_info DUMP.json -o OUT

acc_check runs each call on the CPU as its bench and on "the device" (cuda, or npu with
torch_npu), and refuses to start without one: here the device is the CPU too. Only the
device's name is changed (torch.cuda.set_device is a no-op and the device string is
"cpu"); everything else is acc_check as shipped, run through its own CLI entry point.
Prints `msprobe-seconds S`: the time inside acc_check (the process's start-up not included).
"""

import sys
import time

import torch

torch.cuda.set_device = lambda *args, **kwargs: None

from msprobe.pytorch.api_accuracy_checker.acc_check import acc_check, acc_check_utils  # noqa: E402

acc_check.current_device = "cpu"
acc_check.is_gpu = True
acc_check_utils.current_device = "cpu"

from msprobe.core.acc_check.acc_check_cli import acc_check_cli  # noqa: E402

started = time.perf_counter()
acc_check_cli(sys.argv[1:])
print(f"msprobe-seconds {time.perf_counter() - started:.3f}")
