"""The reference pages' generated parts, written from the code at every build.

Why generated: a hand-copied options table had already lost an option and every default.
Here each page part is a pure function of what the plugin declares (the
options table, the markers, the standards tables, the console scripts, the RESULTS
files), so the docs cannot drift from the code; tests/repository/test_docs.py checks that each part
renders everything there is. As a Sphinx extension it writes the parts into
docs/_generated/ (not a source folder: the pages include them) before the build reads
any page; `python docs/_ext/msprobe_docs.py` writes them without Sphinx.
"""

from __future__ import annotations

import contextlib
import csv
import importlib
import io
import os
import re
import tomllib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
GENERATED = DOCS / "_generated"
TABLES = ROOT / "standards" / "tables"
BENCHMARKS = ROOT / "benchmarks"
STUDIES = ROOT / "studies"
#: where the RESULTS pages go: explanation/results/<name>.md, each including its file
RESULTS_PAGES = DOCS / "explanation" / "results"
#: where the studies' results go: explanation/studies/<name>.md, each including its file
STUDY_PAGES = DOCS / "explanation" / "studies"

#: what each shipped table is for; a table not named here is rendered with its columns
TABLE_PURPOSE = {
    "api_standards.csv": "Which standard judges an API's floating outputs (an API not listed: `benchmark`; "
    "bool and integer outputs: always `binary_consistency`).",
    "thresholds.csv": "Thresholds set per API, for one dtype or every dtype (`*`), over the dtype defaults below.",
}


#: a code span (kept as written, `<` and all), or an angle bracket outside one
_CODE_OR_BRACKET = re.compile(r"(`+).+?\1|[<>]")
_ENTITIES = {"<": "&lt;", ">": "&gt;"}


def escaped(text: str) -> str:
    """Plain text as MyST shows it: `<call name>` outside code spans escaped, which
    MyST would otherwise pass through as an HTML tag (and the browser swallow)."""
    return _CODE_OR_BRACKET.sub(lambda match: match[0] if match[1] else _ENTITIES[match[0]], text)


def cell(value: object) -> str:
    """A value as a Markdown table cell: pipes escaped, never empty."""
    text = str(value).replace("|", "\\|").replace("\n", " ").strip()
    return text or " "


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A MyST pipe table."""
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def anchor(name: str) -> str:
    """A label for a generated section: MyST's `(label)=` target."""
    return f"({name})=\n"


# --------------------------------------------------------------------------- options
def options_markdown(options: Sequence[Any]) -> str:
    """Every option of the table: its flag, ini name, type, default, help text and details.

    `options` are pytest_msprobe.plugin.option_table.Option rows (a parameter, so a test can
    pass a table with one more)."""
    parts = [
        table(
            ("flag", "type", "default", "what"),
            ((f"[`{o.flag}`](#option-{o.name})", o.type_name, _default(o), escaped(o.help)) for o in options),
        )
    ]
    for option in options:
        value = (
            ""
            if option.kind == "bool"
            else f"={option.metavar or ('PATH' if option.kind.startswith('path') else 'VALUE')}"
        )
        parts.append(
            f"{anchor('option-' + option.name)}## `{option.flag}{value}`\n\n"
            f"{escaped(option.help)}.\n\n"
            + (f"{escaped(option.details)}\n\n" if option.details else "")
            + f"- type: {option.type_name}\n- default: {_default(option)}\n- ini option: `{option.name}`\n"
        )
    return "\n".join(parts)


def _default(option: Any) -> str:
    if option.kind == "bool":
        return "off"
    if option.default in (None, (), ""):
        return "none"
    return f"`{option.default}`"


# --------------------------------------------------------------------------- standards
def read_table(path: Path) -> tuple[list[str], list[list[str]]]:
    """A standards table's header and rows (the registry's reading: BOM, blank lines)."""
    with path.open(newline="", encoding="utf-8-sig") as handle:
        rows = [[value.strip() for value in row] for row in csv.reader(handle)]
    rows = [row for row in rows if any(row)]
    return rows[0], rows[1:]


def grouped_by_api(header: Sequence[str], rows: Sequence[Sequence[str]]) -> tuple[list[str], list[list[str]]]:
    """A table with an `api` column, one row per setting with the APIs that share it:
    229 routing rows read as 7 standards, each with its APIs."""
    at = list(header).index("api")
    rest = [name for i, name in enumerate(header) if i != at]
    groups: dict[tuple[str, ...], list[str]] = {}
    for row in rows:
        key = tuple(value for i, value in enumerate(row) if i != at)
        groups.setdefault(key, []).append(row[at])
    return [*rest, "APIs"], [[*key, ", ".join(f"`{api}`" for api in apis)] for key, apis in groups.items()]


def tables_markdown(folder: Path) -> str:
    """Every `*.csv` in the standards' tables folder, each under its file's name."""
    parts = []
    for path in sorted(folder.glob("*.csv")):
        header, rows = read_table(path)
        purpose = TABLE_PURPOSE.get(path.name, f"Columns: {', '.join(f'`{name}`' for name in header)}.")
        shown_header, shown = grouped_by_api(header, rows) if "api" in header else (header, rows)
        parts.append(
            f"{anchor('table-' + path.stem.replace('_', '-'))}### `{path.name}`\n\n{purpose} "
            f"{len(rows)} rows, shown grouped by all but the API.\n\n" + table(shown_header, shown)
        )
    return "\n".join(parts)


def dtype_defaults_markdown(dtypes: dict[str, Any]) -> str:
    """Every default threshold of every dtype (standards/dtypes.py), one column per dtype."""
    names = list(dtypes)
    thresholds = list(dict.fromkeys(key for info in dtypes.values() for key in info.defaults))
    rows = [[f"`{key}`", *(_number(dtypes[name].defaults.get(key)) for name in names)] for key in thresholds]
    return table(["threshold", *names], rows)


def _number(value: float | None) -> str:
    """A threshold as written in the standards: a power of two where it is one."""
    if value is None:
        return "-"
    if value > 0:
        exponent = float(value).hex().split("p")[-1]
        if float(value).hex().startswith("0x1.0000000000000p") and abs(int(exponent)) > 4:
            return f"2^{exponent.lstrip('+')}"
    return f"{value:g}"


def standards_markdown(standards: dict[str, Any]) -> str:
    """The registered standards, each with the first paragraph of its module's docstring."""
    rows = []
    for name, func in standards.items():
        module = importlib.import_module(func.__module__)
        summary = (module.__doc__ or func.__doc__ or "").strip().split("\n\n")[0]
        rows.append((f"`{name}`", f"`{func.__module__}`", " ".join(summary.split())))
    return table(("standard", "module", "what it judges"), rows)


def docstrings_markdown(modules: Sequence[str]) -> str:
    """Each module's docstring as the plain text it is written in (its formulas, |d - b|,
    are not reStructuredText), under the module's name."""
    parts = []
    for name in modules:
        text = (importlib.import_module(name).__doc__ or "").strip()
        parts.append(f"### `{name}`\n\n```text\n{text}\n```\n")
    return "\n".join(parts)


#: the modules whose docstrings explain the standards: each shipped standard's, then the
#: rule without a reference and the sign tests
REASONING = ("single_run", "bias")


# --------------------------------------------------------------------------- result files
def result_files(msprobe_csv: Any, run_files: Any) -> list[tuple[str, str]]:
    """The files a run writes into --msprobe-out, by the writer's own prefixes."""
    return [
        (f"{msprobe_csv.RESULT_PREFIX}{{timestamp}}.csv", "msprobe's result CSV: one row per call (UTF-8 with BOM)"),
        (
            f"{msprobe_csv.DETAILS_PREFIX}{{timestamp}}.csv",
            "msprobe's details CSV: one row per output, every metric (UTF-8 with BOM)",
        ),
        (
            f"{run_files.METRICS_PREFIX}{{timestamp}}.jsonl",
            "every metric of every output, numbers, and the columns below",
        ),
        (
            f"{run_files.JOURNAL_PREFIX}{{timestamp}}.jsonl",
            "the journal: every finished call's record, read by `--msprobe-resume`, `msprobe-merge` and `msprobe-report`",
        ),
        (
            f"{run_files.RUN_PREFIX}{{timestamp}}.json",
            "the run: when, how long, the command, the environment, the sessions that wrote it",
        ),
    ]


def result_files_markdown(
    files: Sequence[tuple[str, str]],
    result_header: Sequence[str],
    metric_columns: Sequence[tuple[str, str]],
    details_header: Sequence[str],
) -> str:
    """The files of a run and the columns of msprobe's two CSVs, each details column with
    the name its metric has in the metrics file."""
    metric_of = {column: key for key, column in metric_columns}
    return (
        table(("file", "what"), ((f"`{name}`", what) for name, what in files))
        + "\n### `accuracy_checking_result_{timestamp}.csv`\n\nOne row per call:\n\n"
        + table(("column",), ((f"`{column}`",) for column in result_header))
        + "\n### `accuracy_checking_details_{timestamp}.csv`\n\nOne row per output of a call:\n\n"
        + table(
            ("column", "metric in the metrics file"),
            ((f"`{column}`", f"`{metric_of[column]}`" if column in metric_of else "") for column in details_header),
        )
    )


# --------------------------------------------------------------------------- markers, scripts
def markers_markdown(markers: Sequence[str]) -> str:
    """The markers the plugin registers ("name: what")."""
    return table(("marker", "what"), ((f"`{m.split(':', 1)[0]}`", m.split(":", 1)[1].strip()) for m in markers))


def console_scripts(pyproject: Path) -> dict[str, str]:
    """The console scripts the package installs: name -> "module:function"."""
    return dict(tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["scripts"])


def script_help(target: str) -> str:
    """A console script's `--help`, as it prints it (argparse, 88 columns)."""
    module, function = target.split(":")
    main = getattr(importlib.import_module(module), function)
    out = io.StringIO()
    width = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "88"  # argparse wraps at the terminal's width: the same page from any terminal
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            main(["--help"])
    finally:
        if width is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = width
    return out.getvalue().rstrip()


def scripts_markdown(scripts: dict[str, str]) -> str:
    """Each console script's usage, from its own argparse."""
    return "\n".join(
        f"{anchor('script-' + name)}## `{name}`\n\n`{target}`\n\n```text\n{script_help(target)}\n```\n"
        for name, target in scripts.items()
    )


# --------------------------------------------------------------------------- RESULTS files
def results_pages(benchmarks: Path) -> dict[str, str]:
    """One page per results file, which includes the file: the timing benchmarks' one
    summary (`benchmarks/RESULTS.md`, page "timings") and each `benchmarks/RESULTS-*.md`."""
    files = {"timings": benchmarks / "RESULTS.md"} | {
        path.stem.removeprefix("RESULTS-"): path for path in sorted(benchmarks.glob("RESULTS-*.md"))
    }
    return {
        name: f"```{{include}} ../../../benchmarks/{path.name}\n```\n" for name, path in files.items() if path.exists()
    }


def study_pages(studies: Path) -> dict[str, str]:
    """One page per study's results file (`studies/<what it derives>.md`; the folder's
    README.md lists the studies and is no result): name -> the page, which includes it."""
    return {
        path.stem: f"```{{include}} ../../../studies/{path.name}\n```\n"
        for path in sorted(studies.glob("*.md"))
        if path.name != "README.md"
    }


def known_defects_markdown(defects: Sequence[Any], reproduce: str) -> str:
    """The known defects' table (pytest_msprobe/judge/defects/table.py), one row per defect."""

    def tracker(url: str) -> str:
        return f"[{url.rsplit('/', 3)[-3]}#{url.rsplit('/', 1)[-1]}]({url})" if url else "none known"

    rows = [
        (
            f"`{row.id}`",
            row.library,
            ", ".join(f"`{operator}`" for operator in row.operators) + f" ({row.direction})",
            row.where.replace("*", "\\*"),
            row.what.replace("*", "\\*"),
            tracker(row.tracker),
            f"`{reproduce} {row.id}`",
            ", ".join(row.seen_on),
        )
        for row in defects
    ]
    header = ("row", "library", "API", "where it shows", "what it is", "tracker", "reproducer", "torch seen on")
    return table(header, rows)


# --------------------------------------------------------------------------- writing
def generated_parts() -> dict[Path, str]:
    """Every generated file: path -> content."""
    from pytest_msprobe.judge.defects.table import DEFECTS, REPRODUCE
    from pytest_msprobe.plugin import MARKERS
    from pytest_msprobe.plugin.option_table import OPTIONS
    from pytest_msprobe.results import msprobe_csv, run_files
    from pytest_msprobe.standards.dtypes import DTYPES
    from pytest_msprobe.standards.registry import SHIPPED_STANDARDS

    parts = {
        GENERATED / "options.md": options_markdown(OPTIONS),
        GENERATED / "tables.md": tables_markdown(TABLES),
        GENERATED / "dtype-defaults.md": dtype_defaults_markdown(DTYPES),
        GENERATED / "standards.md": standards_markdown(SHIPPED_STANDARDS),
        GENERATED / "reasoning.md": docstrings_markdown(
            [
                *dict.fromkeys(f.__module__ for f in SHIPPED_STANDARDS.values()),
                *(f"pytest_msprobe.standards.{m}" for m in REASONING),
            ]
        ),
        GENERATED / "markers.md": markers_markdown(MARKERS),
        GENERATED / "result-files.md": result_files_markdown(
            result_files(msprobe_csv, run_files),
            msprobe_csv.RESULT_HEADER,
            msprobe_csv.METRIC_COLUMNS,
            msprobe_csv.DETAILS_HEADER,
        ),
        GENERATED / "scripts.md": scripts_markdown(console_scripts(ROOT / "pyproject.toml")),
        GENERATED / "known-defects.md": known_defects_markdown(DEFECTS, REPRODUCE),
    }
    parts.update({RESULTS_PAGES / f"{name}.md": page for name, page in results_pages(BENCHMARKS).items()})
    parts.update({STUDY_PAGES / f"{name}.md": page for name, page in study_pages(STUDIES).items()})
    return parts


#: folders whose every page is generated: a page whose source is gone is removed with it
#: (a results file moved or deleted must not leave its old page in the toctree's glob)
OWNED_FOLDERS = (RESULTS_PAGES, STUDY_PAGES)


def write_parts(parts: dict[Path, str], owned: tuple[Path, ...] = OWNED_FOLDERS) -> list[Path]:
    """Write what changed (an unchanged file keeps its time: Sphinx rereads nothing), and
    remove the pages of `owned` folders that no part generates any more."""
    for folder in owned:
        for stale in set(folder.glob("*.md")) - set(parts):
            stale.unlink()
    written = []
    for path, content in parts.items():
        if not path.exists() or path.read_text(encoding="utf-8") != content:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content, encoding="utf-8")
            written.append(path)
    return written


def _on_config_inited(app: Any, config: Any) -> None:
    write_parts(generated_parts())


def setup(app: Any) -> dict[str, Any]:
    app.connect("config-inited", _on_config_inited)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":
    for written in write_parts(generated_parts()):
        print(written.relative_to(ROOT))
