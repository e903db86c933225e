"""Baselines: the metrics of an earlier trusted run, to judge a new run against.

The CI that gates a CANN or torch_npu upgrade asks: did any operator get less
accurate than before? A baseline records every call's metrics (not tensors) with the
environment that produced them, one JSON line per call, sorted, so that a git diff of
two baselines reads call by call. A run with `--msprobe-baseline` hands each call's
recorded metrics to the standards as its reference (benchmark and ULP judge ratios to
them), then compares statuses and metrics to name regressions and improvements.

A baseline names each dump by its path from the rootdir of the run that recorded it,
and records each dump's identity (dump.json's size and SHA-256, and a SHA-256 of its
content: dump.json with every tensor file it names) in its environment. A later run finds
its dumps in the baseline by identity, wherever it runs from and wherever the dump now
lies; a dump whose content changed is found by its path (and said to have changed); a
dump the baseline has no record of is said so, loudly, rather than judged "new" call by
call in silence.

msprobe's own `accuracy_checking_details_*.csv` (from run_ut on another device) is
read into the same shape, so existing results become a one-run reference.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import hashlib
import json
import os
import platform
import re
import stat
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, cast

from pytest_msprobe.dump.index import TENSOR_FOLDER
from pytest_msprobe.judge.check.outcome import KEY_METRICS
from pytest_msprobe.judge.verdict.record import ResultRecord
from pytest_msprobe.standards.verdict import STATUS_ORDER

if TYPE_CHECKING:
    from pytest_msprobe.dump.index import Record
    from pytest_msprobe.judge.gate.kernel_verdicts import KernelVerdict
    from pytest_msprobe.standards import Verdict
    from pytest_msprobe.standards.verdict import Status

FORMAT = "pytest-msprobe-baseline"
VERSION = 1
FILE_NAME = "msprobe-baseline.jsonl"
BASELINE_LABEL = "baseline"  # the standards' name of a reference of recorded metrics
IMPORTED_LABEL = "reference CSV"  # what a verdict against an msprobe details CSV is called instead
IMPROVED_BELOW = 0.5  # every judged metric at most half the baseline's: an improvement

#: the standard a baseline's kernel verdicts are recorded under (judge/gate/kernel_verdicts.py): a
#: kernel's line holds its pooled metrics as the metrics of one output named ""
KERNEL_STANDARD = "kernel"

# Metrics where larger is better (a share of good elements): compared inverted.
HIGHER_IS_BETTER = {"rel_err_thousandth"}


class BaselineError(Exception):
    """A baseline file that cannot be used: a usage error naming the file."""


@dataclass(frozen=True)
class CallMetrics:
    """What a baseline holds of one call."""

    status: Status
    standard: str
    outputs: dict[str, dict[str, float]]  # output path -> metric -> value
    # what pairs the call with a call of another dump of the model (judge/gate/upgrade.py):
    # its outputs' device dtype, its signature's digest and its position in its dump
    # ("" and -1 where not known: a kernel, an older baseline)
    dtype: str = ""
    signature: str = ""
    order: int = -1

    def to_json(self, dump: str, call: str) -> str:
        pairing: dict[str, str | int] = {"dtype": self.dtype} if self.dtype else {}
        pairing.update({"signature": self.signature, "order": self.order} if self.signature else {})
        return json.dumps(
            {
                "dump": dump,
                "call": call,
                "status": self.status,
                "standard": self.standard,
                "outputs": self.outputs,
                **pairing,
            },
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def of(cls, record: ResultRecord) -> CallMetrics:
        outputs = {}
        for output in record.outputs:
            kept = KEY_METRICS.get(output.standard, ())  # the metrics its verdict turns on
            outputs[output.path] = {key: _short(output.metrics[key]) for key in kept if key in output.metrics}
        return cls(record.status, record.standard, outputs, record.outputs[0].device_dtype if record.outputs else "")

    @classmethod
    def of_kernel(cls, verdict: KernelVerdict) -> CallMetrics:
        return cls(
            verdict.status, KERNEL_STANDARD, {"": {key: _short(value) for key, value in verdict.metrics.items()}}
        )


def _short(value: float) -> float:
    """Six significant digits: enough to judge ratios, small enough for git."""
    return float(f"{value:.6g}")


@dataclass(frozen=True)
class DumpMatch:
    """Which recorded dump one dump of a run is."""

    key: str  # the dump's key in this run (its path from this run's rootdir)
    recorded_as: str | None  # its key in the baseline; None: the baseline has no record of it
    changed: bool = False  # found by its path, but its content is not the recorded dump's
    # another dump of the model (after an upgrade): its calls are paired with the recorded
    # ones by name and signature and judged against their own bench (judge/gate/upgrade.py)
    by_signature: bool = False

    def note(self, source: str) -> str | None:
        """What the user must be told about this match, None when nothing."""
        if self.by_signature:
            said = (
                f"{source}: the dump {self.key} is not the one the baseline was recorded with (its content differs: dump.json or its tensor files)"
                if self.changed
                else f"{source} has no record of the dump {self.key}"
            )
            return (
                f"{said}: its calls are paired with the recorded calls of the same signature (another dump of the "
                "model, as after an operator upgrade), each judged against its own bench; the summary says how many paired"
            )
        if self.recorded_as is None:
            return (
                f"{source} has no record of the dump {self.key}: its calls are all judged as new. "
                "Was the baseline recorded with another dump? Record one of this dump with --msprobe-baseline-save"
            )
        if self.changed:
            return (
                f"{source}: the dump {self.key} is not the one the baseline was recorded with (its content differs: dump.json or its tensor files): "
                "its calls are compared with the records of the dump that lay there"
            )
        return None


@dataclass
class Baseline:
    """Recorded metrics by (dump key, call name); `dump` is None for calls imported
    from an msprobe CSV, which names no dump. `aliases` maps the keys of this run's
    dumps to the keys the baseline knows them by (see match_dumps)."""

    environment: Record = field(default_factory=dict)
    calls: dict[tuple[str | None, str], CallMetrics] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)

    def recorded_key(self, dump: str) -> str:
        """The baseline's key of a dump of this run."""
        return self.aliases.get(dump, dump)

    def get(self, dump: str, call: str) -> CallMetrics | None:
        return self.calls.get((self.recorded_key(dump), call)) or self.calls.get((None, call))

    def kernel(self, dump: str, name: str) -> tuple[str, CallMetrics] | None:
        """The recorded verdict of a kernel of this run, with the dump it was recorded
        in: in the dump the baseline knows this one as, else (a dump it has no record
        of: the same model dumped again after an operator upgrade) in the one recorded
        dump that has a kernel of that name. Each call was judged against the bench on
        its own inputs, so a kernel's verdicts compare across two dumps of one model."""
        recorded = self.calls.get((self.recorded_key(dump), name))
        if recorded is not None:
            return self.recorded_key(dump), recorded
        if dump in self.aliases:
            return None
        found = [(key, metrics) for (key, call), metrics in self.calls.items() if call == name and key is not None]
        return found[0] if len(found) == 1 else None

    def reference_for(self, dump: str, call: str) -> dict[str, dict[str, float]] | None:
        """The standards' `reference=` for this call, or None for a call it lacks."""
        found = self.get(dump, call)
        return found.outputs if found is not None and found.outputs else None

    def label_verdict(self, verdict: Verdict, dump: str, call: str) -> Verdict:
        """The call's verdict with its reference named for what it is: the standards
        call any recorded metrics "baseline", also an msprobe details CSV's row."""
        if (self.recorded_key(dump), call) in self.calls:
            return verdict
        return _relabel_as_baseline(verdict, IMPORTED_LABEL)

    def match_dumps(self, dumps: Iterable[tuple[str, Path]]) -> list[DumpMatch]:
        """Find each (key, path) dump of this run among the recorded dumps and remember
        the key it is recorded under: the recorded dump of the same content, the same
        key preferred (copies of one dump); else the same key (a dump made again);
        else none. A baseline that names no dumps (an older one) matches by key."""
        recorded: Record = self.environment.get("dumps") or {}
        by_digest: dict[str, list[str]] = {}
        for key, identity in recorded.items():
            by_digest.setdefault(_content_key(identity), []).append(key)
        matches = []
        for key, path in dumps:
            same_content = by_digest.get(_content_key(dump_identity(path), recorded), []) if recorded else []
            if key in same_content or (not recorded and any(dump == key for dump, _ in self.calls)):
                match = DumpMatch(key, key)
            elif same_content:
                match = DumpMatch(key, max(same_content, key=lambda other: _common_tail(other, key)))
            elif key in recorded:
                match = DumpMatch(key, key, changed=True, by_signature=self.has_signatures(key))
            else:
                match = DumpMatch(key, None, by_signature=self.has_signatures())
            if match.recorded_as is not None and not match.by_signature:
                self.aliases[key] = match.recorded_as
            matches.append(match)
        return matches

    def has_signatures(self, dump: str | None = None) -> bool:
        """Whether the baseline recorded its calls' signatures (of `dump`, or of any dump):
        what pairs the calls of another dump of the model with them (judge/gate/upgrade.py)."""
        return any(metrics.signature for (key, _), metrics in self.calls.items() if dump is None or key == dump)

    def update(self, records: Iterable[tuple[str, ResultRecord]]) -> None:
        for dump, record in records:
            self.calls[(dump, record.call)] = CallMetrics.of(record)

    def write(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / FILE_NAME
        header = {"format": FORMAT, "version": VERSION, "environment": self.environment}
        lines = [json.dumps(header, sort_keys=True)]
        lines += [metrics.to_json(dump or "", call) for (dump, call), metrics in sorted(self.calls.items(), key=_order)]
        temporary = path.with_suffix(".tmp")
        temporary.write_text("\n".join(lines) + "\n", encoding="utf-8")
        os.replace(temporary, path)  # a crash mid-write never leaves half a baseline
        return path

    @classmethod
    def read(cls, folder: Path) -> Baseline:
        path = folder / FILE_NAME if folder.is_dir() else folder
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise BaselineError(
                f"{path}: cannot be read ({exc.strerror or exc}); record one with --msprobe-baseline-save"
            ) from None
        try:
            header = json.loads(lines[0]) if lines else {}
        except json.JSONDecodeError:
            header = {}
        if header.get("format") != FORMAT:
            raise BaselineError(f"{path}: is not a pytest-msprobe baseline (no {FORMAT!r} header line)")
        if header.get("version") != VERSION:
            raise BaselineError(
                f"{path}: baseline format version {header.get('version')!r}; this pytest-msprobe reads version {VERSION}"
            )
        baseline = cls(environment=header.get("environment", {}))
        for number, line in enumerate(lines[1:], start=2):
            try:
                item = json.loads(line)
                baseline.calls[(item["dump"], item["call"])] = CallMetrics(
                    item["status"],
                    item["standard"],
                    item["outputs"],
                    item.get("dtype", ""),
                    item.get("signature", ""),
                    item.get("order", -1),
                )
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise BaselineError(f"{path}:{number}: not a baseline line ({exc})") from None
        return baseline


def _content_key(identity: Record, recorded: Record | None = None) -> str:
    """What a dump is matched by: its content (dump.json and tensor files); a baseline
    recorded before tensors were hashed (its identities have no `content`) by its
    dump.json's SHA-256, as it was then."""
    older = recorded is not None and not any("content" in other for other in recorded.values())
    return str(identity.get("sha256") if older or "content" not in identity else identity["content"])


def _common_tail(first: str, second: str) -> int:
    """How many trailing path parts two keys share (rank1/dump.json ~ step0/rank1/dump.json)."""
    count = 0
    for a, b in zip(reversed(Path(first).parts), reversed(Path(second).parts), strict=False):
        if a != b:
            break
        count += 1
    return count


def _relabel_as_baseline(verdict: Verdict, label: str) -> Verdict:
    """The verdict, and each of its outputs, with a "baseline" reference called `label`
    ("baseline, forward results saved in ..." keeps its tail)."""
    reference = verdict.reference
    if reference == BASELINE_LABEL or reference.startswith(BASELINE_LABEL + ","):
        reference = label + reference[len(BASELINE_LABEL) :]
    return dataclasses.replace(
        verdict, reference=reference, outputs=tuple(_relabel_as_baseline(output, label) for output in verdict.outputs)
    )


def _order(item: tuple[tuple[str | None, str], CallMetrics]) -> tuple[str, str]:
    (dump, call), _ = item
    return dump or "", call


# --- comparing a run with its baseline ---------------------------------------------


@dataclass(frozen=True)
class Change:
    kind: str  # "regression", "improvement", "unchanged", "new"
    call: str
    was: Status | Literal[""]  # "": a new call, with no recorded status
    now: Status
    ratio: float | None  # the largest growth of a judged metric (now / baseline)
    metric: str


def compare(current: CallMetrics, recorded: CallMetrics | None, call: str) -> Change:
    if recorded is None:
        return Change("new", call, "", current.status, None, "")
    ratio, metric = largest_growth(current, recorded)
    was, now = STATUS_ORDER.get(recorded.status, 1), STATUS_ORDER.get(current.status, 1)
    if now > was:
        kind = "regression"
    elif now < was or (ratio is not None and ratio <= IMPROVED_BELOW and _any_error(recorded)):
        kind = "improvement"
    else:
        kind = "unchanged"
    return Change(kind, call, recorded.status, current.status, ratio, metric)


def largest_growth(current: CallMetrics, recorded: CallMetrics) -> tuple[float | None, str]:
    """max over outputs and shared metrics of now / baseline (inverted for shares of
    good elements); a metric that was 0 and is not now counts as infinite growth."""
    worst: tuple[float | None, str] = (None, "")
    for path, metrics in current.outputs.items():
        before = recorded.outputs.get(path, {})
        for key, now in metrics.items():
            if key not in before or key == "eb":
                continue
            was = before[key]
            if key in HIGHER_IS_BETTER:
                now, was = 1.0 - now, 1.0 - was
            growth = (now / was) if was else (float("inf") if now else 1.0)
            if worst[0] is None or growth > worst[0]:
                worst = (growth, f"{path}{key}" if path else key)
    return worst


def _any_error(recorded: CallMetrics) -> bool:
    return any(
        value
        for metrics in recorded.outputs.values()
        for key, value in metrics.items()
        if key not in HIGHER_IS_BETTER and key != "eb"
    )


# --- the environment a baseline was recorded in ------------------------------------


def environment(
    dumps: Iterable[tuple[str, Path]], device: str, versions: Mapping[str, str | None] | None = None
) -> Record:
    """What produced the metrics: versions (this process's, unless given: the xdist
    controller imports no torch and takes a worker's), device, and which dumps (by content)."""
    if versions is None:
        versions = {name: _version(name) for name in ("torch", "torch_npu", "mindspore", "numpy")}
    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": {name: version for name, version in versions.items() if version},
        "cann": _cann_version(),
        "device": device,
        "dumps": {key: dump_identity(path) for key, path in dumps},
    }


def _version(module: str) -> str | None:
    loaded = sys.modules.get(module)  # never import torch_npu or MindSpore just to ask
    if loaded is None:
        return None
    return str(getattr(loaded, "__version__", "")) or None


def _cann_version() -> str | None:
    home = os.environ.get("ASCEND_TOOLKIT_HOME") or os.environ.get("ASCEND_HOME_PATH")
    if not home:
        return None
    for name in ("version.cfg", "version.info"):
        candidate = Path(home) / name
        if candidate.is_file():
            return candidate.read_text(errors="replace").strip()[:200]
    return home


def dump_identity(path: Path) -> Record:
    """What identifies a dump wherever it lies: its dump.json's size and SHA-256, and its
    `content`, a SHA-256 over dump.json and every tensor file it names (name, size and
    bytes): a dump.json copied beside other tensor files is another dump, whose calls
    are paired with the recorded ones, not judged against records of other inputs. Each
    file is read once per process while unchanged; a file that is missing or lies
    outside dump_tensor_data/ counts as such (its call's test says why)."""
    found = path.stat()
    identity = _json_identity(path, found.st_size, found.st_mtime_ns)
    folder = os.path.realpath(path.parent / TENSOR_FOLDER)
    content = hashlib.sha256(identity.sha256.encode())
    for name in identity.tensors:
        content.update(f"\0{name}\0{_tensor_digest(folder, name)}".encode())
    return {
        "size": identity.size,
        "sha256": identity.sha256,
        "content": content.hexdigest(),
        "tensor_files": len(identity.tensors),
    }


@dataclass(frozen=True)
class _JsonIdentity:
    size: int
    sha256: str
    tensors: tuple[str, ...]  # the data_names it references, sorted, once each


#: a tensor's file name in dump.json: msprobe writes `"data_name": "<file>"` for every
#: saved tensor, and the name holds no quote (call names and .pt/.npy suffixes)
_DATA_NAME = re.compile(rb'"data_name"\s*:\s*"([^"\\]*)"')


@functools.lru_cache(maxsize=64)
def _json_identity(path: Path, size: int, mtime_ns: int) -> _JsonIdentity:
    raw = path.read_bytes()
    names = sorted({match.decode("utf-8", "replace") for match in _DATA_NAME.findall(raw)})
    return _JsonIdentity(size, hashlib.sha256(raw).hexdigest(), tuple(names))


def _tensor_digest(folder: str, name: str) -> str:
    """A tensor file's size and SHA-256, "missing" or "outside" where there is none to
    read inside the (resolved) folder: names are confined as dump/tensors.py confines
    them, a plain file name with one stat."""
    candidate = os.path.join(folder, name)
    try:
        found = os.lstat(candidate)
        if os.sep in name or (os.altsep and os.altsep in name) or stat.S_ISLNK(found.st_mode):
            candidate = os.path.realpath(candidate)
            if os.path.commonpath([folder, candidate]) != folder or candidate == folder:
                return "outside"
            found = os.stat(candidate)
    except OSError:
        return "missing"
    return _file_digest(candidate, found.st_size, found.st_mtime_ns)


@functools.cache  # one short string per tensor file of the run's dumps
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return f"{size}:{digest.hexdigest()}"


# --- msprobe's details CSV as a reference ---------------------------------------------

# msprobe's details columns -> our metric keys (the spec's "msprobe's result files").
MSPROBE_COLUMNS = {
    "二进制一致错误率": "error_rate",
    "误差均衡性": "eb",
    "均方根误差": "rmse",
    "小值域错误占比": "small_value_err_ratio",
    "相对误差最大值": "max_rel_err",
    "相对误差平均值": "mean_rel_err",
    "inf/nan错误率": "inf_nan_error_ratio",
    "相对误差错误率": "rel_err_ratio",
    "绝对误差错误率": "abs_err_ratio",
    "ULP误差最大值": "max_ulp_err",
    "ULP误差平均值": "mean_ulp_err",
    "ULP误差大于阈值占比": "ulp_err_proportion",
    "双千指标": "rel_err_thousandth",
}


def read_msprobe_details(path: Path) -> Baseline:
    """msprobe's `accuracy_checking_details_*.csv` as recorded metrics per output.

    Its rows name outputs `Functional.linear.0.forward.output.1`; our paths are ""
    for a single output and "[i]" inside a tuple, so output 0 is filed under both.
    """
    try:
        with open(path, encoding="utf-8-sig", newline="") as handle:
            rows = list(csv.DictReader(handle))
    except OSError as exc:
        raise BaselineError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if rows and "API Name" not in rows[0]:
        raise BaselineError(f"{path}: not an msprobe details CSV (no 'API Name' column)")
    baseline = Baseline(environment={"imported_from": str(path)})
    for row in rows:
        name, _, position = row["API Name"].rpartition(".output.")
        if not name or not position.isdigit():
            continue
        metrics = {key: float(row[column]) for column, key in MSPROBE_COLUMNS.items() if _is_number(row.get(column))}
        previous = baseline.calls.get((None, name))
        outputs = dict(previous.outputs) if previous else {}
        outputs[f"[{position}]"] = metrics
        if position == "0":
            outputs[""] = metrics
        # msprobe writes pass, warning, error or SKIP; any other text is kept as written
        # (ranked as a skip where it meets another status)
        status = cast("Status", str(row.get("Status", "")).strip().lower())
        baseline.calls[(None, name)] = CallMetrics(_worse(previous.status if previous else "pass", status), "", outputs)
    return baseline


def _is_number(text: str | None) -> bool:
    if text is None:
        return False  # as float(None)'s TypeError
    try:
        float(text)
    except (TypeError, ValueError):
        return False
    return True


def _worse(first: Status, second: Status) -> Status:
    return max((first, second), key=lambda status: STATUS_ORDER.get(status, 0))
