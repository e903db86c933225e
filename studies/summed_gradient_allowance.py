"""The allowance for summed gradients whose shares the dump does not hold.

    python studies/summed_gradient_allowance.py DUMP_JSON [DUMP_JSON ...]

For every backward call of each (tensor) dump whose offline input gradient is a sum
with shares rerun on the bench, or with the call's own share added in pieces
(judge/offline/missing_shares.py), prints per summed input: whose shares those are, how many elements get an allowance (of all), its median in ULPs
of D at the bench's value, and the measured excess against it: max |device - reference|
/ allowance and max |device - bench| / allowance over those elements, and how many
elements lie beyond it (the device's and the reference's distance before the allowance
is applied). The device here is the dump (offline); the reference is the CPU's kernel
in D and the bench the raised-precision one, both summed as autograd did. Ratios below 1
are a correct kernel within the bound; the part of device - bench beyond it is the own
kernel's error the ULP standard judges (under 1 ULP of D passes).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
from pytest_msprobe.dump.index import parse_call_name, read_index  # noqa: E402
from pytest_msprobe.errors import CallError, CallSkip  # noqa: E402
from pytest_msprobe.judge.check import call as call_module  # noqa: E402
from pytest_msprobe.judge.offline import missing_shares as shares  # noqa: E402
from pytest_msprobe.run.devices import Backend  # noqa: E402
from pytest_msprobe.standards import Registry  # noqa: E402


def measured(dump: Path) -> list[str]:
    """One line per summed input gradient with an allowance."""
    index = read_index(dump)
    settings = call_module.Settings(
        backend=Backend(), device_index=0, max_elements=1 << 30, registry=Registry.default(), offline=True
    )
    seen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    original = shares.beyond

    def keep(values: torch.Tensor, bench: torch.Tensor, allowance: torch.Tensor) -> torch.Tensor:
        seen.append((values, bench, allowance))
        return original(values, bench, allowance)

    shares.beyond = keep
    lines = []
    try:
        for call in index.names:
            name = parse_call_name(call)
            if name is None or name.direction != "backward":
                continue
            seen.clear()
            try:
                replayed = call_module.replay_call(index, name, settings)
            except (CallSkip, CallError):
                continue
            notes = [
                origin for origin in getattr(replayed.device.evidence, "origins", []) if "rounding allowance" in origin
            ]
            for number in range(0, len(seen) - 1, 2):
                (device, bench, allowance), (reference, _, _) = seen[number], seen[number + 1]
                lines.append(
                    f"{dump.parent.name} {name}: {_line(device, reference, bench, allowance)}; {_readers(notes, number // 2)}"
                )
    finally:
        shares.beyond = original
    return lines


def _line(device: torch.Tensor, reference: torch.Tensor, bench: torch.Tensor, allowance: torch.Tensor) -> str:
    allowed = allowance > 0
    width = allowance / shares.ulp(bench.reshape(-1).double(), device.dtype)
    off = {
        label: (side.reshape(-1).double() - bench.reshape(-1).double()).abs()
        for label, side in (("device", device), ("reference", reference))
    }
    between = (device.reshape(-1).double() - reference.reshape(-1).double()).abs()
    return (
        f"{device.dtype}, {int(allowed.sum())}/{allowance.numel()} elements allowed, median {float(width[allowed].median()):.3g} ULP; "
        f"max |dev-ref|/allowance {float((between[allowed] / allowance[allowed]).max()):.3g} "
        f"({int((between > allowance)[allowed].sum())} beyond), "
        f"max |dev-bench|/allowance {float((off['device'][allowed] / allowance[allowed]).max()):.3g} "
        f"({int((off['device'] > allowance)[allowed].sum())} beyond), "
        f"max |ref-bench|/allowance {float((off['reference'][allowed] / allowance[allowed]).max()):.3g}"
    )


def _readers(notes: list[str], number: int) -> str:
    if number >= len(notes):
        return ""
    return notes[number].split(": the device added them")[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dumps", nargs="+", type=Path)
    args = parser.parse_args()
    for dump in args.dumps:
        lines = measured(dump)
        print(f"{dump}: {len(lines)} summed gradients with an allowance")
        for line in lines:
            print("  " + line)


if __name__ == "__main__":
    main()
