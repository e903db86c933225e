"""Reproduce a known defect (judge/defects/table.py's rows) without the plugin, as a failure
message cites it:

    python -m pytest_msprobe.judge.defects.reproduce torch-cpu-scalar-rounded
    python -m pytest_msprobe.judge.defects.reproduce --list
    python -m pytest_msprobe.judge.defects.reproduce --all

Each reproducer prints the kernel against float64 beside a formula of the same cost
without the defect; a row's reproducer is also named by its function
(judge/defects/explored_reproducers.py, judge/defects/model_reproducers.py).
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Callable, Sequence

from pytest_msprobe.judge.defects import explored_reproducers, model_reproducers
from pytest_msprobe.judge.defects.table import BY_ID, DEFECTS

PROG = "python -m pytest_msprobe.judge.defects.reproduce"


def by_name() -> dict[str, Callable[[], None]]:
    """Every shipped reproducer, by its function's name."""
    return {
        function.__name__: function for function in (*explored_reproducers.REPRODUCERS, *model_reproducers.REPRODUCERS)
    }


def chosen(names: Sequence[str], parser: argparse.ArgumentParser) -> list[Callable[[], None]]:
    """The reproducers of `names` (row ids or reproducer names), each once, in order; an
    unknown name stops with the closest ones."""
    functions = by_name()
    found: list[Callable[[], None]] = []
    for name in names:
        key = BY_ID[name].reproducer if name in BY_ID else name
        if key not in functions:
            close = difflib.get_close_matches(name, [*BY_ID, *functions], n=3)
            parser.error(
                f"{name!r} is no known defect's row nor a reproducer"
                + (f"; did you mean {', '.join(close)}?" if close else "; see --list")
            )
        if functions[key] not in found:
            found.append(functions[key])
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description="Reproduce a known library defect without the plugin.")
    parser.add_argument("rows", nargs="*", help="a row of the known defects (as a failure names it), or a reproducer")
    parser.add_argument("--all", action="store_true", help="run every reproducer")
    parser.add_argument("--list", action="store_true", help="list the known defects and their reproducers")
    options = parser.parse_args(argv)
    if options.list:
        for row in DEFECTS:
            print(f"{row.id}: {row.library}, {row.what} [{row.reproducer}]")
        return 0
    if not options.rows and not options.all:
        parser.error("name a row (see --list), or --all")
    for function in by_name().values() if options.all else chosen(options.rows, parser):
        function()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
