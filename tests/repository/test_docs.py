"""The documentation: it builds with warnings as errors, and its references are generated
from the code, so that nothing the plugin declares is left out.

Each check is a small function that returns what is missing, run once on the real
plugin (nothing missing) and once on a planted fault (the fault is named): an
undocumented option, a standards table or row the reference lacks, a threshold, a flag
the docs name that does not exist, a help text out of pytest's style, a broken link."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

from pytest_msprobe.plugin import MARKERS
from pytest_msprobe.plugin.option_table import OPTIONS, Number, Option
from pytest_msprobe.results import msprobe_csv, run_files
from pytest_msprobe.standards.dtypes import DTYPES
from pytest_msprobe.standards.registry import SHIPPED_STANDARDS

ROOT = Path(__file__).parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
FLAG = re.compile(r"--msprobe-[a-z0-9][a-z0-9-]*")
INI = re.compile(r"^\s+(msprobe_[a-z0-9_]+)", re.M)


def _generator():
    """docs/_ext/msprobe_docs.py, the Sphinx extension that writes the references."""
    spec = importlib.util.spec_from_file_location("msprobe_docs", DOCS / "_ext" / "msprobe_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _generator()


# --------------------------------------------------------------------------- the checks
def registered(help_text: str) -> set[str]:
    """Every flag and ini option of the plugin, as `pytest --help` lists them."""
    return set(FLAG.findall(help_text)) | set(INI.findall(help_text))


def undocumented(names: Iterable[str], reference: str) -> list[str]:
    """The flags and ini options the options reference has no entry for (a flag's entry
    is its heading: `--msprobe-html` is not documented by `--msprobe-html-all`'s)."""

    def documented(name: str) -> bool:
        if name.startswith("--"):
            return re.search(rf"^## `{re.escape(name)}[=`]", reference, re.M) is not None
        return f"ini option: `{name}`" in reference

    return sorted(name for name in names if not documented(name))


def unknown_flags(text: str, flags: set[str]) -> list[str]:
    """The --msprobe-* flags a text names that the plugin does not have (renamed, removed)."""
    return sorted(set(FLAG.findall(text)) - flags)


def unrendered(folder: Path, rendered: str) -> list[str]:
    """Each table of the folder, or row of a table, that the rendered reference lacks:
    `file` for a whole table, `file: row` for a row (its settings' line must name its API)."""
    lines = rendered.splitlines()
    missing = []
    for path in sorted(folder.glob("*.csv")):
        if f"### `{path.name}`" not in rendered:
            missing.append(path.name)
            continue
        header, rows = gen.read_table(path)
        at = header.index("api") if "api" in header else None
        for row in rows:
            settings = "| " + " | ".join(gen.cell(v) for i, v in enumerate(row) if i != at) + " |"
            if not any(line.startswith(settings) and (at is None or f"`{row[at]}`" in line) for line in lines):
                missing.append(f"{path.name}: {','.join(row)}")
    return missing


def missing_thresholds(dtypes: dict, rendered: str) -> list[str]:
    """The dtype defaults (dtype: threshold) the rendered defaults table lacks."""
    rows = {line.split("|")[1].strip(): line for line in rendered.splitlines() if line.startswith("| `")}
    header = [name.strip() for name in rendered.splitlines()[0].strip("|").split("|")]
    missing = []
    for name, info in dtypes.items():
        for key, value in info.defaults.items():
            row = rows.get(f"`{key}`")
            column = header.index(name) if name in header else None
            if row is None or column is None or row.split("|")[column + 1].strip() != gen._number(value):
                missing.append(f"{name}: {key}")
    return missing


def style_problems(options: Iterable[Option]) -> list[str]:
    """Help texts out of pytest's style (a capitalised phrase, no trailing period, no
    "see README"), and numbers not typed."""
    problems = []
    for option in options:
        if not option.help[:1].isupper():
            problems.append(f"{option.flag}: not capitalised")
        if option.help.endswith("."):
            problems.append(f"{option.flag}: ends with a period")
        if "readme" in option.help.lower():
            problems.append(f"{option.flag}: points to the README")
        if str(option.default).isdigit() and option.number is None:
            problems.append(f"{option.flag}: a number without a type")
    return problems


#: a file of the repository named in backquotes: from its root, or a stage's module
#: (`run/dropout.py`: pytest_msprobe/run/dropout.py)
REPO_PATH = re.compile(
    r"(?<!})`((?:benchmarks|studies|tools|pytest_msprobe|standards|bench_functions|tests|examples|\.ci)/[\w/.-]*\w)`"
)
STAGE_PATH = re.compile(r"`((?:dump|run|judge|results|scripts|plugin)/[\w/-]+\.(?:py|toml|html))`")


#: the public API whose reference must list each parameter (docs/reference/api.md)
PARAMETERISED = (
    "pytest_msprobe.standards.check",
    "pytest_msprobe.standards.Registry.load_file",
    "pytest_msprobe.standards.Registry.register_standard",
    "pytest_msprobe.standards.Registry.set_api_standard",
    "pytest_msprobe.standards.Registry.set_threshold",
    "pytest_msprobe.standards.Registry.standard_for",
    "pytest_msprobe.standards.Registry.thresholds_for",
    "pytest_msprobe.standards.Registry.check",
    "pytest_msprobe.plugin.hookspecs.pytest_msprobe_register_standards",
    "pytest_msprobe.plugin.hookspecs.pytest_msprobe_register_bench_functions",
    "pytest_msprobe.plugin.hookspecs.pytest_msprobe_result",
    "pytest_msprobe.bench_functions.get",
    "pytest_msprobe.bench_functions.register",
    "pytest_msprobe.bench_functions.Registry.register",
    "pytest_msprobe.bench_functions.Registry.get",
)
#: ... and what it returns
RETURNING = (
    "pytest_msprobe.standards.check",
    "pytest_msprobe.standards.Registry.default",
    "pytest_msprobe.standards.Registry.standard_for",
    "pytest_msprobe.standards.Registry.thresholds_for",
    "pytest_msprobe.standards.Registry.check",
    "pytest_msprobe.bench_functions.get",
    "pytest_msprobe.bench_functions.names",
    "pytest_msprobe.bench_functions.Registry.get",
    "pytest_msprobe.bench_functions.Registry.names",
    "pytest_msprobe.bench_functions.Registry.copy",
)
API_ENTRY = re.compile(r'<dt class="sig sig-object py" id="([^"]+)"')


def without_field(html: str, names: Iterable[str], field: str) -> list[str]:
    """The API entries of a rendered page without a described `field` field list
    ("Parameters", "Returns"): missing, or with an item that has no text after its name
    and type (what autodoc writes from the type hints alone). Each entry's text runs
    from its signature to the next entry's."""
    starts = [(match.group(1), match.start()) for match in API_ENTRY.finditer(html)]
    entries = {
        name: html[start : starts[number + 1][1] if number + 1 < len(starts) else len(html)]
        for number, (name, start) in enumerate(starts)
    }
    listed = re.compile(
        rf'<dt class="field-(odd|even)">{field}<span class="colon">:</span></dt>\s*<dd class="field-\1">(.*?)</dd>',
        re.S,
    )

    def described(entry: str) -> bool:
        found = listed.search(entry)
        if found is None or field != "Parameters":
            return found is not None
        items = found.group(2).split("<strong>")[1:]  # one per parameter
        return bool(items) and all(" -- " in re.sub(r"<[^>]+>", "", item) for item in items)

    return [name for name in names if name not in entries or not described(entries[name])]


def test_an_api_entry_without_described_parameters_is_named() -> None:
    """Prose in place of a Parameters section renders one paragraph, and autodoc's type
    hints alone a list of names and types: the check names both, and an entry that is
    missing altogether."""
    entry = '<dt class="sig sig-object py" id="{}">{}</dt><dd><p>{}</p>{}</dd>'
    field = '<dl class="field-list simple"><dt class="field-odd">{}<span class="colon">:</span></dt><dd class="field-odd">{}</dd></dl>'
    described = field.format("Parameters", "<p><strong>x</strong> (<em>int</em>) -- What is judged.</p>")
    typed = field.format("Parameters", "<p><strong>x</strong> (<em>int</em>)</p>")
    page = (
        entry.format("mod.described", "described(x)", "Judge x.", described)
        + entry.format("mod.prose", "prose(x)", "x: what is judged.", "")
        + entry.format("mod.typed", "typed(x)", "Judge x.", typed)
    )
    names = ["mod.described", "mod.prose", "mod.typed", "mod.absent"]
    assert without_field(page, names, "Parameters") == ["mod.prose", "mod.typed", "mod.absent"]
    assert without_field(page, ["mod.described"], "Returns") == ["mod.described"]


def missing_files(text: str) -> list[str]:
    """The repository files a page names (`benchmarks/test_html.py`, `judge/offline/dumped_run.py`)
    that do not exist: moved or renamed since the page was written."""
    named = set(REPO_PATH.findall(text)) | {f"pytest_msprobe/{path}" for path in STAGE_PATH.findall(text)}
    return sorted(path for path in named if not (ROOT / path).exists())


def broken_links(text: str, base: Path) -> list[str]:
    """The relative links of a Markdown text whose target does not exist."""
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    return sorted(t for t in targets if "://" not in t and not (base / t).exists())


# --------------------------------------------------------------------------- options
@pytest.fixture(scope="module")
def help_text() -> str:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--help"], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_every_option_is_in_the_reference(help_text: str) -> None:
    names = registered(help_text)
    assert {o.flag for o in OPTIONS} | {o.name for o in OPTIONS} <= names
    assert undocumented(names, gen.options_markdown(OPTIONS)) == []


def test_a_planted_undocumented_option_fails(pytester: pytest.Pytester) -> None:
    """An option registered beside the table (not in it) is named, flag and ini option."""
    pytester.makeconftest(
        "def pytest_addoption(parser):\n"
        "    parser.getgroup('msprobe').addoption('--msprobe-planted', help='Planted')\n"
        "    parser.addini('msprobe_planted', 'Planted')\n"
    )
    names = registered(pytester.runpytest("--help").stdout.str())
    assert undocumented(names, gen.options_markdown(OPTIONS)) == ["--msprobe-planted", "msprobe_planted"]


def test_angle_brackets_in_option_texts_are_shown_not_taken_for_html() -> None:
    planted = Option("msprobe_planted", "Write DIR/<call name>.py", details="Named `<api>.<dtype>` or <call>")
    reference = gen.options_markdown([planted])
    assert "Write DIR/&lt;call name&gt;.py" in reference and "<call name>" not in reference
    assert "Named `<api>.<dtype>` or &lt;call&gt;" in reference  # code spans as written


def test_each_option_shows_its_type_and_default() -> None:
    reference = gen.options_markdown(OPTIONS)
    for option in OPTIONS:
        entry = reference.split(f"## `{option.flag}", 1)[1].split("\n## ", 1)[0]
        assert f"- type: {option.type_name}" in entry and f"- default: {gen._default(option)}" in entry, entry
    assert "- type: integer >= 1 (device runs)\n- default: `1`" in reference
    assert "- type: one of auto, cpu, cuda, npu\n- default: `auto`" in reference


def test_the_docs_name_only_flags_that_exist(help_text: str) -> None:
    flags = set(FLAG.findall(help_text))
    pages = [
        README,
        ROOT / "CHANGELOG.md",
        *(p for p in DOCS.rglob("*.md") if "_generated" not in p.parts and "_build" not in p.parts),
    ]
    assert {
        str(p.relative_to(ROOT)): unknown
        for p in pages
        if (unknown := unknown_flags(p.read_text(encoding="utf-8"), flags))
    } == {}
    assert unknown_flags("run with `--msprobe-dump=x --msprobe-offlin`", flags) == ["--msprobe-offlin"]  # planted


def test_the_docs_name_only_files_that_exist() -> None:
    pages = [
        README,
        # the results pages include files checked below; the records of past changes name files as they were
        *(
            p
            for p in DOCS.rglob("*.md")
            if not {"_generated", "results", "studies"} & set(p.parts)
            and (p.parent.name != "developing" or p.name == "index.md")
        ),
        *(ROOT / folder / "README.md" for folder in ("studies", "tools")),
    ]
    assert {
        str(p.relative_to(ROOT)): missing for p in pages if (missing := missing_files(p.read_text(encoding="utf-8")))
    } == {}
    planted = "see `benchmarks/test_html.py`, `judge/offline/dumped_run.py`, `judge/nosuch.py` and `benchmarks/RESULTS-nosuch.md`"
    assert missing_files(planted) == ["benchmarks/RESULTS-nosuch.md", "pytest_msprobe/judge/nosuch.py"]
    planted = "`studies/nosuch.py`, `tools/nosuch.sh`, {doc}`studies/verdicts-on-real-models` (a page, not a file)"
    assert missing_files(planted) == ["studies/nosuch.py", "tools/nosuch.sh"]
    harnesses = re.findall(
        r"`(\w+\.(?:py|sh))`", (DOCS / "explanation" / "measurements.md").read_text(encoding="utf-8")
    )
    folders = ("benchmarks", "studies", "tools")
    assert len(harnesses) > 20 and [h for h in harnesses if not any((ROOT / f / h).exists() for f in folders)] == []


def test_help_texts_follow_pytests_style() -> None:
    assert style_problems(OPTIONS) == []
    planted = (
        Option("msprobe_planted", "see the README for this.", default="3"),
        Option("msprobe_typed", "Typed", number=Number("x", 0)),
    )
    assert style_problems(planted) == [
        "--msprobe-planted: not capitalised",
        "--msprobe-planted: ends with a period",
        "--msprobe-planted: points to the README",
        "--msprobe-planted: a number without a type",
    ]


# --------------------------------------------------------------------------- standards
def test_every_standards_table_and_row_is_rendered() -> None:
    assert list(gen.TABLES.glob("*.csv")), gen.TABLES
    assert unrendered(gen.TABLES, gen.tables_markdown(gen.TABLES)) == []


def test_a_planted_table_or_row_the_reference_lacks_is_named(tmp_path: Path) -> None:
    """A reference rendered before a table (or a row) was added lacks it; rendered again,
    it has it: the reference takes whatever tables the folder holds."""
    before = gen.tables_markdown(gen.TABLES)
    folder = tmp_path / "tables"
    shutil.copytree(gen.TABLES, folder)
    (folder / "planted.csv").write_text("api,limit\nplanted_op,3\n", encoding="utf-8")
    with (folder / "thresholds.csv").open("a", encoding="utf-8") as table:
        table.write("planted_row_op,*,rmse_ratio,7\n")
    assert unrendered(folder, before) == ["planted.csv", "thresholds.csv: planted_row_op,*,rmse_ratio,7"]
    after = gen.tables_markdown(folder)
    assert unrendered(folder, after) == []
    assert "| 3 | `planted_op` |" in after and "Columns: `api`, `limit`." in after


def test_every_dtype_default_threshold_is_rendered() -> None:
    rendered = gen.dtype_defaults_markdown(DTYPES)
    assert missing_thresholds(DTYPES, rendered) == []
    float16 = DTYPES["float16"]
    planted = {**DTYPES, "float16": dataclasses.replace(float16, defaults={**float16.defaults, "planted_limit": 0.5})}
    assert missing_thresholds(planted, rendered) == ["float16: planted_limit"]
    assert (
        "| `rtol` | 2^-20 | 2^-20 | 2^-10 | 2^-8 |" in rendered
    )  # float64, float32, float16, bfloat16: as dtypes.py writes them


def test_every_standard_marker_script_result_column_and_results_file_is_rendered() -> None:
    standards = gen.standards_markdown(SHIPPED_STANDARDS)
    assert all(f"| `{name}` |" in standards for name in SHIPPED_STANDARDS)
    markers = gen.markers_markdown(MARKERS)
    assert all(f"| `{marker.split(':')[0]}` |" in markers for marker in MARKERS)
    scripts = gen.console_scripts(ROOT / "pyproject.toml")
    assert set(scripts) == {"msprobe-merge", "msprobe-report", "msprobe-script"}
    rendered = gen.scripts_markdown(scripts)
    assert all(f"## `{name}`" in rendered and f"usage: {name}" in rendered for name in scripts)
    files = gen.result_files_markdown(
        gen.result_files(msprobe_csv, run_files),
        msprobe_csv.RESULT_HEADER,
        msprobe_csv.METRIC_COLUMNS,
        msprobe_csv.DETAILS_HEADER,
    )
    assert all(f"| `{column}` |" in files for column in (*msprobe_csv.RESULT_HEADER, *msprobe_csv.DETAILS_HEADER))
    assert all(f"| `{column}` | `{key}` |" in files for key, column in msprobe_csv.METRIC_COLUMNS)
    assert all(prefix in files for prefix in (run_files.METRICS_PREFIX, run_files.JOURNAL_PREFIX, run_files.RUN_PREFIX))
    results = gen.results_pages(gen.BENCHMARKS)
    assert results.keys() == {"timings"} | {
        p.stem.removeprefix("RESULTS-") for p in gen.BENCHMARKS.glob("RESULTS-*.md")
    }
    assert "benchmarks/RESULTS.md" in results["timings"]
    studies = gen.study_pages(gen.STUDIES)
    assert {f"{name}.md" for name in studies} == {p.name for p in gen.STUDIES.glob("*.md")} - {"README.md"}


def test_a_planted_study_result_gets_a_page_and_the_readme_none(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("# Studies\n", encoding="utf-8")
    (tmp_path / "planted-limits.md").write_text("# Planted\n", encoding="utf-8")
    assert gen.study_pages(tmp_path) == {"planted-limits": "```{include} ../../../studies/planted-limits.md\n```\n"}


def test_a_page_whose_results_file_is_gone_is_removed(tmp_path: Path) -> None:
    """A results file moved or deleted leaves no page behind for the toctree's glob (a
    local rebuild after the move failed on -W: the old page had no title any more)."""
    owned = tmp_path / "results"
    owned.mkdir()
    (owned / "moved-away.md").write_text("```{include} ../../../benchmarks/RESULTS-moved-away.md\n```\n")
    kept = owned / "timings.md"
    other = tmp_path / "index.md"
    other.write_text("# not generated\n")
    assert gen.write_parts({kept: "page\n"}, owned=(owned,)) == [kept]
    assert sorted(path.name for path in owned.iterdir()) == ["timings.md"]
    assert other.exists()


# --------------------------------------------------------------------------- README
def test_the_readme_keeps_its_set_up_commands_first_and_its_links() -> None:
    text = README.read_text(encoding="utf-8")
    commands = re.findall(r"^    \$ (.*)$", text, re.M)
    assert len(commands) == 2, commands  # .ci/run runs the second
    assert commands[0].startswith("python3 -m venv .venv") and "--msprobe-dump=examples/" in commands[0]
    assert '-e ".[mindspore,test,dev,docs]"' in commands[1] and commands[1].endswith("pytest -n 2 tests")
    assert len(text.splitlines()) <= 120
    assert broken_links(text, ROOT) == []
    assert broken_links("[gate](docs/how-to/upgrade-gate.md) [x](docs/how-to/nosuch.md#a)", ROOT) == [
        "docs/how-to/nosuch.md"
    ]
    for page in (
        "docs/how-to/offline.md",
        "docs/how-to/upgrade-gate.md",
        "docs/how-to/many-devices.md",
    ):  # one click each
        assert f"]({page})" in text, page


# --------------------------------------------------------------------------- the build
def test_the_docs_build_with_warnings_as_errors(tmp_path: Path) -> None:
    """The site builds with -W (a warning fails CI), and its pages hold what the
    generators wrote: every option and every standards table."""
    pytest.importorskip("sphinx", reason="the docs extra is not installed: pip install -e '.[docs]'")
    pytest.importorskip("furo", reason="the docs extra is not installed: pip install -e '.[docs]'")
    pytest.importorskip("myst_parser", reason="the docs extra is not installed: pip install -e '.[docs]'")
    out = tmp_path / "html"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-W",
            "--keep-going",
            "-q",
            "-b",
            "html",
            "-d",
            str(tmp_path / "doctrees"),
            str(DOCS),
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-5000:]
    options = (out / "reference" / "options.html").read_text(encoding="utf-8")
    assert all(option.flag in options for option in OPTIONS)
    # text in angle brackets shows as text, not as an HTML tag the browser swallows
    assert "DIR/&lt;call name&gt;.py" in options and "<call name>" not in options
    standards = (out / "reference" / "standards.html").read_text(encoding="utf-8")
    assert all(path.name in standards for path in gen.TABLES.glob("*.csv"))
    assert (out / "_images" / "report.png").exists() or (out / "_static" / "report.png").exists()
    api = (out / "reference" / "api.html").read_text(encoding="utf-8")
    assert without_field(api, PARAMETERISED, "Parameters") == []
    assert without_field(api, RETURNING, "Returns") == []
