"""Whether two runs of the verdict harnesses judged every call alike: the check that a
refactor left the verdicts unchanged.

    python tools/compare_records.py BEFORE AFTER     # exit 1 on any difference

BEFORE and AFTER are folders of harness outputs (studies/real_models.py's --scratch,
studies/kernel_diversity.py's --scratch, or a folder holding several). Every result
file found below them (the journal msprobe_records_*.jsonl, accuracy_checking_metrics_*.jsonl,
and the CSVs accuracy_checking_{result,details,kernels}_*.csv) is matched with its twin by
relative path, and every row of one with the row of the same test in the other: each test
whose status, message, metric, threshold or any other field differs is printed, with
the fields and both values, and so is every test or file on one side only.

Why not `diff -r`: the same code run twice writes files that differ in five ways that say
nothing about a change of code, found by running each harness twice (see
docs/developing/verdict-records.md); they are the only things this script ignores:

- file names carry the run's timestamp (msprobe's %Y%m%d%H%M%S, `_N` where that second was
  taken): files are matched with it removed;
- `duration` (a call's seconds) in the journal and the metrics lines: wall time;
- absolute paths of the output folder: kernel_diversity.py judges a copy of each dump under
  its --scratch, so a record's `dump` names BEFORE or AFTER; each side's own folder is
  replaced by `<ROOT>` in every value (paths outside it, $REAL_DUMPS, stay);
- row order: with pytest-xdist workers tests finish, and so are written, in any order:
  rows are matched by their test (dump and call; for the metrics lines also direction
  and output name; for the CSVs the name column, the rows of one name compared as a bag);
- the random numbers of single-run dropout: the device draws a new mask each run (with
  -n 0 too), and the dropped share, the metrics and the message follow it; the calls of
  such an API (in a folder whose journal shows a single-run record with the `dropped`
  finding) are compared by their verdict fields only (VERDICT_FIELDS: status, standard,
  dtypes, shapes), in every file of that folder.

msprobe_run_*.json is not read: it holds the session (start time, command line, versions),
no verdict. Numbers are compared exactly, as written: a refactor must not move one bit.
"""

from __future__ import annotations

import argparse
import csv
import json
import posixpath
import re
import sys
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

Json = None | bool | int | float | str | list["Json"] | dict[str, "Json"]
Row = dict[str, Json]

#: the run's timestamp in a result file's name: `_20261127191946` or `_20261127191946_2`
STAMP = re.compile(r"_\d{14}(?:_\d+)?(?=\.(?:jsonl|csv)$)")
#: fields that change between two runs of the same code (wall time)
IGNORED_FIELDS = frozenset({"duration"})
ROOT = "<ROOT>"


def _jsonl_rows(path: Path) -> list[Row]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _csv_rows(path: Path) -> list[Row]:
    with open(path, encoding="utf-8-sig", newline="") as handle:
        return [dict(row) for row in csv.DictReader(handle)]


def _fields(*names: str) -> Callable[[Row], str]:
    return lambda row: " ".join(str(row.get(name, "")) for name in names)


def _first_column(row: Row) -> str:
    return str(next(iter(row.values()), ""))


@dataclass(frozen=True)
class Kind:
    """A kind of result file: its name pattern, how it is read, and what names a test in it."""

    pattern: str
    read: Callable[[Path], list[Row]]
    key: Callable[[Row], str]
    name: Callable[[Row], str]  # the call (or kernel) the row is about


JOURNAL = Kind("msprobe_records_*.jsonl", _jsonl_rows, _fields("dump", "call"), _fields("call"))
KINDS = (
    JOURNAL,
    Kind(
        "accuracy_checking_metrics_*.jsonl", _jsonl_rows, _fields("dump", "call", "direction", "name"), _fields("call")
    ),
    Kind("accuracy_checking_result_*.csv", _csv_rows, _first_column, _first_column),
    Kind("accuracy_checking_details_*.csv", _csv_rows, _first_column, _first_column),
    Kind("accuracy_checking_kernels_*.csv", _csv_rows, _first_column, _first_column),
)
#: `Functional.dropout.0.forward.output.0`, `Functional.dropout.float32.kernel` -> `Functional.dropout`
API = re.compile(r"(.+?)\.(?:\d+|[a-z]*\d+\.kernel)(?:\.|$)")
#: what a verdict is, the fields compared for a call that drew random numbers
VERDICT_FIELDS = frozenset(
    {"dump", "call", "direction", "name", "output", "path", "status", "standard", "reference", "device", "device_dtype"}
    | {"bench_dtype", "shape", "outputs", "Forward Test Success", "Backward Test Success", "Status"}
    | {"API name", "API Name", "Bench Dtype", "DEVICE Dtype", "Shape"}
)


@dataclass(frozen=True)
class Difference:
    """One test (or file) that is not the same on both sides: where, and how."""

    file: str
    test: str
    detail: str

    def __str__(self) -> str:
        return f"{self.file}: {self.test}: {self.detail}" if self.test else f"{self.file}: {self.detail}"


def result_files(root: Path) -> dict[str, tuple[Kind, Path]]:
    """Every result file below root by its path relative to root, the timestamp removed
    (`#2`, `#3` for the later runs where one folder holds several, oldest first)."""
    found: dict[str, tuple[Kind, Path]] = {}
    for kind in KINDS:
        for path in sorted(root.rglob(kind.pattern)):
            name = STAMP.sub("", path.relative_to(root).as_posix())
            key, count = name, 1
            while key in found:
                count += 1
                key = f"{name}#{count}"
            found[key] = (kind, path)
    return found


def normalised(value: Json, root: str) -> Json:
    """The value with the ignored fields dropped and the side's own folder as <ROOT>."""
    if isinstance(value, dict):
        return {key: normalised(item, root) for key, item in value.items() if key not in IGNORED_FIELDS}
    if isinstance(value, list):
        return [normalised(item, root) for item in value]
    if isinstance(value, str):
        return value.replace(root, ROOT)
    return value


def _text(value: Json) -> str:
    """Exact and NaN-safe: json writes NaN as NaN, and -0.0 differs from 0.0."""
    return json.dumps(value, sort_keys=True)


def field_changes(before: Json, after: Json, where: str = "") -> Iterator[str]:
    """`field: before -> after` for every leaf that differs (nested fields dotted)."""
    if isinstance(before, dict) and isinstance(after, dict):
        for key in [*before, *(key for key in after if key not in before)]:
            yield from field_changes(
                before.get(key, "<absent>"), after.get(key, "<absent>"), f"{where}.{key}" if where else key
            )
    elif isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        for index, (one, other) in enumerate(zip(before, after, strict=True)):
            yield from field_changes(one, other, f"{where}[{index}]")
    elif _text(before) != _text(after):
        yield f"{where or 'row'}: {_text(before)} -> {_text(after)}"


def api(name: str) -> str:
    match = API.match(name)
    return match[1] if match else name


def random_apis(journal: list[Row]) -> set[str]:
    """The APIs whose single-run verdicts hang on random numbers drawn in the run: the
    device runs a dropout with torch's generator, which no run seeds alike (even with
    -n 0), so its mask, and with it the dropped share, the metrics and the message, differ
    from run to run (the status does not: a wrong share is |z| > 5). Found in the journal:
    a single-run record whose outputs carry the `dropped` finding (judge/findings/finding.py)."""

    def drew(row: Row) -> bool:
        outputs = row.get("outputs")
        findings = (
            [output.get("findings") for output in outputs if isinstance(output, dict)]
            if isinstance(outputs, list)
            else []
        )
        return row.get("reference") == "single-run" and any(
            isinstance(found, dict) and "dropped" in found for found in findings
        )

    return {api(str(row.get("call", ""))) for row in journal if drew(row)}


def verdict_only(row: Row) -> Row:
    """The fields of a row that are its verdict (for each output too), not its random numbers."""
    kept: Row = {key: value for key, value in row.items() if key in VERDICT_FIELDS}
    if isinstance(outputs := kept.get("outputs"), list):
        kept["outputs"] = [verdict_only(output) if isinstance(output, dict) else output for output in outputs]
    return kept


def _by_test(kind: Kind, path: Path, root: Path, random: set[str]) -> dict[str, list[Row]]:
    tests: dict[str, list[Row]] = defaultdict(list)
    for row in kind.read(path):
        clean = normalised(row, str(root))
        assert isinstance(clean, dict)
        tests[kind.key(clean)].append(verdict_only(clean) if api(kind.name(clean)) in random else clean)
    return tests


def _row_changes(before: list[Row], after: list[Row]) -> str:
    """How the rows of one test differ: field by field where each side has one row (or
    the rows that differ pair up), else which rows each side has alone."""
    if not before or not after:
        return f"only in {'AFTER' if not before else 'BEFORE'} ({len(before) or len(after)} rows)"
    texts = [sorted(_text(row) for row in side) for side in (before, after)]
    gone = [json.loads(text) for text in texts[0] if text not in texts[1]]
    came = [json.loads(text) for text in texts[1] if text not in texts[0]]
    if len(gone) == len(came):
        return " | ".join("; ".join(field_changes(one, other)) for one, other in zip(gone, came, strict=True))
    return f"{len(before)} rows -> {len(after)}; only before: {[_text(r)[:200] for r in gone]}; only after: {[_text(r)[:200] for r in came]}"


@dataclass(frozen=True)
class Comparison:
    """What was compared, and every difference found."""

    files: int
    tests: int
    random_tests: int  # of tests: calls that drew random numbers, compared by verdict only
    differences: list[Difference]


def compare_file(
    name: str, kind: Kind, paths: tuple[Path, Path], roots: tuple[Path, Path], random: set[str]
) -> Comparison:
    """One file against its twin: its tests, and each that differs."""
    old, new = (_by_test(kind, path, root, random) for path, root in zip(paths, roots, strict=True))
    tests = [*old, *(test for test in new if test not in old)]
    differing = [
        test for test in tests if sorted(map(_text, old.get(test, []))) != sorted(map(_text, new.get(test, [])))
    ]
    drawn = sum(api(kind.name((old.get(test) or new[test])[0])) in random for test in tests)
    return Comparison(
        1,
        len(tests),
        drawn,
        [Difference(name, test, _row_changes(old.get(test, []), new.get(test, []))) for test in differing],
    )


def _random_by_folder(files: dict[str, tuple[Kind, Path]]) -> dict[str, set[str]]:
    """Each folder's random APIs, read from its journals: they hold for every file beside them."""
    found: dict[str, set[str]] = defaultdict(set)
    for name, (kind, path) in files.items():
        if kind is JOURNAL:
            found[posixpath.dirname(name)] |= random_apis(kind.read(path))
    return found


def compare(before: Path, after: Path) -> Comparison:
    """Every result file of two folders against its twin."""
    old, new = result_files(before), result_files(after)
    roots = before.resolve(), after.resolve()
    random = _random_by_folder(old)
    for folder, apis in _random_by_folder(new).items():
        random[folder] |= apis
    parts = [
        compare_file(name, old[name][0], (old[name][1], new[name][1]), roots, random[posixpath.dirname(name)])
        for name in sorted(old.keys() & new.keys())
    ]
    alone = [Difference(name, "", "only in BEFORE") for name in old if name not in new]
    alone += [Difference(name, "", "only in AFTER") for name in new if name not in old]
    return Comparison(
        len(parts),
        sum(part.tests for part in parts),
        sum(part.random_tests for part in parts),
        alone + [difference for part in parts for difference in part.differences],
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("before", type=Path, help="a folder of harness outputs (searched recursively)")
    parser.add_argument("after", type=Path, help="the folder to compare with it")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = compare(args.before, args.after)
    for difference in result.differences:
        print(difference)
    print(
        f"{result.files} files, {result.tests} tests compared ({result.random_tests} of calls that drew random numbers, "
        f"by verdict only): {len(result.differences)} differences"
    )
    if not result.files:
        print(f"no result files in both {args.before} and {args.after}: nothing was compared", file=sys.stderr)
        return 2
    return 1 if result.differences else 0


if __name__ == "__main__":
    sys.exit(main())
