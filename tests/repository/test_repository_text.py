"""What the repository's files may not hold: a path that exists on one machine only (a
user, a CI runner or the next maintainer has none of them: scripts take an argument or a
documented environment variable instead) and a ticket number (a file, a heading or a
docstring says what it holds, not which ticket asked for it).

Read from git's list of tracked files, so a fresh clone checks exactly what was committed.
msprobe's dumps name the folder of the machine that wrote them (`dump_data_dir`): that
foreign path, the same in every shipped dump, is the one allowed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# home and work folders of this project's machines; the shipped dumps' own foreign folder
MACHINE_PATH = re.compile(r"(?<![\w.$-])/(?:work|root|Users|home/(?!user/msprobe_dump/))[\w.-]*/")
# an issue or ticket by number; upstream trackers are cited by their own form (pytorch/pytorch#N)
TICKET = re.compile(r"\b(?:[Ii]ssues?|[Tt]ickets?) ?#?\d+\b")
TICKET_NAME = re.compile(r"(?:issue|ticket)[-_]?\d+", re.IGNORECASE)
# a repository path a file cites (`studies/kernel_ratios.py`, `pytest_msprobe/judge/check/call.py`)
CITED = re.compile(
    r"(?<![\w/.-])((?:tests|pytest_msprobe|studies|tools|benchmarks|standards|bench_functions|docs|examples|\.ci)"
    r"/[\w/.-]*\w\.(?:py|sh|md|toml|csv|html))"
)
# where a cited path may be gone: dated records of past runs keep the paths of their day, the
# tests plant made-up paths, and the docs build writes its own pages
RECORDS = {
    "CHANGELOG.md",
    "benchmarks/RESULTS.md",
    "docs/developing/verdict-records.md",
    "docs/developing/real-models-before-data-flow.md",
}
PLANTED = "tests/"
GENERATED = ("docs/_build/", "docs/_generated/", "docs/explanation/results/", "docs/explanation/studies/")
# The planted examples below are assembled from these parts, so that this file holds no
# machine path and no ticket itself: the check reads it like every other tracked file.
WORK, ROOT_HOME, HOME = ("/" + folder for folder in ("work", "root", "home"))
ISSUE = "iss" + "ue"
TEXT_SUFFIXES = {".py", ".md", ".sh", ".toml", ".cfg", ".ini", ".txt", ".json", ".yaml", ".yml", ".css", ".html", ""}


def tracked_text_files() -> list[Path]:
    """Every tracked text file, this one included (its planted examples are assembled)."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / name for name in listed.stdout.split("\0") if name and Path(name).suffix in TEXT_SUFFIXES]


def findings(name: str, text: str) -> list[str]:
    """Each forbidden thing in one file, as `name:line: what`."""
    found = [f"{name}: a file named after a ticket"] if TICKET_NAME.search(Path(name).name) else []
    for number, line in enumerate(text.splitlines(), 1):
        found += [f"{name}:{number}: machine path {m.group(0)}" for m in MACHINE_PATH.finditer(line)]
        found += [f"{name}:{number}: ticket {m.group(0)}" for m in TICKET.finditer(line)]
    return found


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout")
def test_no_tracked_file_holds_a_machine_path_or_a_ticket() -> None:
    found = [
        finding
        for path in tracked_text_files()
        for finding in findings(str(path.relative_to(ROOT)), path.read_text(encoding="utf-8", errors="replace"))
    ]
    assert found == []


def missing_citations(name: str, text: str, root: Path) -> list[str]:
    """The repository paths `text` cites that are not in `root` (standards/ and
    bench_functions/ also under their installed names, pytest_msprobe/standards/...)."""
    found = []
    for cited in dict.fromkeys(CITED.findall(text)):
        if cited.startswith(GENERATED):
            continue
        on_disk = re.sub(r"^pytest_msprobe/(standards|bench_functions)/", r"\1/", cited)
        if not (root / on_disk).exists():
            found.append(f"{name}: cites {cited}, which is not in the repository")
    return found


def _citing(name: str) -> bool:
    """Whether a tracked file's citations are held to the repository as it is."""
    record = name in RECORDS or (name.startswith("studies/") and name.endswith(".md") and name != "studies/README.md")
    return not record and not name.startswith((PLANTED, *GENERATED))


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout")
def test_every_path_a_file_cites_exists() -> None:
    """A moved or renamed file leaves no reader pointing at its old place: the docs, the
    READMEs, docstrings, help texts and scripts cite paths that exist."""
    found = [
        problem
        for path in tracked_text_files()
        if _citing(name := str(path.relative_to(ROOT)))
        for problem in missing_citations(name, path.read_text(encoding="utf-8", errors="replace"), ROOT)
    ]
    assert found == []


def test_a_planted_citation_of_a_gone_file_is_found() -> None:
    text = "see `studies/kernel_ratios.py`, benchmarks/bench_percall.py and pytest_msprobe/standards/ulp.py"
    assert missing_citations("x.md", text, ROOT) == [
        "x.md: cites benchmarks/bench_percall.py, which is not in the repository"
    ]
    assert missing_citations("x.md", "docs/_build/html/index.html", ROOT) == []
    assert not _citing("studies/correct-kernels-across-cpu-paths.md") and _citing("studies/README.md")


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("benchmarks/x.py", f'default="{WORK}/real-dumps"', [f"benchmarks/x.py:1: machine path {WORK}/"]),
        ("studies/x.py", f'Path("{ROOT_HOME}/dumps")', [f"studies/x.py:1: machine path {ROOT_HOME}/"]),
        ("tools/x.sh", f"DUMPS={HOME}/alice/real", [f"tools/x.sh:1: machine path {HOME}/alice/"]),
        (f"studies/{ISSUE}48-limits.md", "", [f"studies/{ISSUE}48-limits.md: a file named after a ticket"]),
        ("x.md", f"made in {ROOT_HOME}/.cache/x", [f"x.md:1: machine path {ROOT_HOME}/"]),
        ("x.md", f"see {HOME}/alice/dumps", [f"x.md:1: machine path {HOME}/alice/"]),
        ("x.md", f"# Records for {ISSUE} 41", [f"x.md:1: ticket {ISSUE} 41"]),
        ("x.py", f'"""{ISSUE.title()} 29: the GEMM backward."""', [f"x.py:1: ticket {ISSUE.title()} 29"]),
        (f"benchmarks/{ISSUE}41_harnesses.sh", "", [f"benchmarks/{ISSUE}41_harnesses.sh: a file named after a ticket"]),
        ("d/dump.json", '"dump_data_dir": "/home/user/msprobe_dump/step0/rank0"', []),
        ("x.md", "pytorch/pytorch#185517, `$REAL_DUMPS`, ./work/x, tmp_path / 'work'", []),
    ],
)
def test_a_planted_path_or_ticket_is_found(name: str, text: str, expected: list[str]) -> None:
    assert findings(name, text) == expected
