"""The package layout follows a call's path, and the imports keep to it: a stage imports
only from itself and the stages before it, only the pytest layer imports pytest, the
standards and bench_functions libraries import no stage, the testing helpers
(pytest_msprobe.testing) import no stage and no stage imports them, and no module cycle
exists; no module of the package, the studies, the tools or the benchmarks is over
MAX_LINES lines unless LONG_MODULES says why. The test tree, put on sys.path folder by
folder, shadows no package and holds no two modules of one name.

Read from the source with `ast` (imports inside functions included), so the rule holds
for lazy imports too. Each rule is also shown to fail on a planted violation.
"""

from __future__ import annotations

import ast
import importlib
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Where each importable package lives in the repository (the installed names).
PACKAGE_DIRS = {
    "pytest_msprobe": ROOT / "pytest_msprobe",
    "pytest_msprobe.standards": ROOT / "standards",
    "pytest_msprobe.bench_functions": ROOT / "bench_functions",
}
# The stages in the order a call passes them; `base` is what every stage shares.
STAGES = ("base", "dump", "run", "judge", "results", "scripts", "plugin")
LIBRARIES = ("standards", "bench_functions")
# judge/'s features in order (pytest_msprobe/judge/__init__.py): each imports only from
# itself and the features before it. `TYPE_CHECKING` imports are left out of this rule
# (an annotation is no dependency at run time): verdict's Judgement names offline's layouts.
JUDGE_FEATURES = ("verdict", "offline", "findings", "defects", "check", "explore", "reduce", "gate")
# the helpers that tests, studies and benchmarks share: shipped, never used by the plugin
TESTING = "testing"
# the scripts beside the package: held to the module-size rule as the package is
SCRIPT_DIRS = {folder: ROOT / folder for folder in ("benchmarks", "studies", "tools")}
PYTEST_MODULES = ("pytest", "_pytest", "pluggy", "xdist")
OPTIONAL_PACKAGES = {"mindspore", "torch_npu"}  # the extras: maybe not installed here
# A module past this many lines is split where it has seams (~500 lines), or
# listed in LONG_MODULES with the reason it stays one.
MAX_LINES = 560
LONG_MODULES = {
    "pytest_msprobe/results/html_page.py": "one self-contained report page: its template, styles and script",
    "bench_functions/fusion_attention.py": (
        "one reference implementation of npu_fusion_attention: its layouts, masks and both directions"
    ),
}


def modules(package_dirs: dict[str, Path]) -> dict[str, Path]:
    """Every module's dotted name -> its file."""
    found = {}
    for package, folder in package_dirs.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            found[".".join((package, *parts))] = path
    return found


def _type_checking_blocks(tree: ast.Module) -> set[int]:
    """The ids of the import nodes under `if TYPE_CHECKING:`."""
    return {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
        for inner in ast.walk(node)
        if isinstance(inner, ast.Import | ast.ImportFrom)
    }


def imports(name: str, path: Path, known: set[str], *, annotations: bool = True) -> set[str]:
    """The modules `name` imports (at any depth of its code): `from P import m` counts
    as importing the module P.m where that is a module, else P. Without `annotations`,
    the imports under `if TYPE_CHECKING:` are left out."""
    is_package = path.name == "__init__.py"
    found = set()
    tree = ast.parse(path.read_text("utf-8"))
    typing_only = set() if annotations else _type_checking_blocks(tree)
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return found


def sys_path_problems(tests: Path, packages: set[str]) -> list[str]:
    """What pytest's default import mode would get wrong in a tree of test folders without
    __init__.py: it puts the folder of each test module and conftest.py on sys.path and
    imports each module by its bare name, so a folder there imports as a namespace package
    (tests/mindspore made `pytest.importorskip("mindspore")` succeed without MindSpore
    under xdist), a module there shadows a package, and two modules of one name collide
    (pytest's "import file mismatch", or a helper silently imported from another folder)."""
    on_path = {path.parent for pattern in ("test_*.py", "conftest.py") for path in tests.rglob(pattern)}
    problems, seen = [], {}
    for entry in sorted(entry for folder in on_path for entry in folder.iterdir() if not entry.name.startswith("__")):
        relative = entry.relative_to(tests.parent).as_posix()
        if entry.is_dir() and not (entry / "__init__.py").exists() and entry.name in packages:
            problems.append(f"{relative}/ imports as the package {entry.name}: rename the folder")
        elif entry.suffix == ".py" and entry.name != "conftest.py":
            if entry.stem in packages:
                problems.append(f"{relative} shadows the package {entry.stem}: rename the module")
            if entry.stem in seen:
                problems.append(f"{relative} and {seen[entry.stem]}: two modules named {entry.stem}, rename one")
            seen[entry.stem] = relative
    return problems


def test_no_test_folder_or_module_shadows_a_package_or_another() -> None:
    import importlib.metadata

    packages = set(importlib.metadata.packages_distributions()) | OPTIONAL_PACKAGES
    assert sys_path_problems(ROOT / "tests", packages) == []


@pytest.mark.parametrize(
    "files,expected",
    [
        (["tests/judge/test_a.py", "tests/judge/mindspore/data.json"], "tests/judge/mindspore/ imports as the package"),
        (["tests/run/conftest.py", "tests/run/torch.py"], "tests/run/torch.py shadows the package torch"),
        (["tests/dump/test_a.py", "tests/judge/gate/test_a.py"], "two modules named test_a"),
        (["tests/results/test_a.py", "tests/results/planted.py", "tests/scripts/planted.py", "tests/scripts/test_b.py"],
         "two modules named planted"),
    ],
    ids=["folder-named-like-a-package", "module-named-like-a-package", "two-test-modules", "two-helpers"],
)  # fmt: skip
def test_a_planted_sys_path_problem_is_found(tmp_path: Path, files: list[str], expected: str) -> None:
    for relative in files:
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text("")
    (tmp_path / "tests" / "run" / "data").mkdir(parents=True)  # a plain folder, no test module: not on sys.path
    (tmp_path / "tests" / "run" / "data" / "mindspore").mkdir()
    found = sys_path_problems(tmp_path / "tests", {"mindspore", "torch"})
    assert [problem for problem in found if expected in problem] and len(found) == 1, found


def stage_of(module: str) -> str:
    parts = module.split(".")
    if parts[0] != "pytest_msprobe" or len(parts) == 1:
        return "outside" if parts[0] != "pytest_msprobe" else "base"
    return parts[1] if parts[1] in (*STAGES, *LIBRARIES, TESTING) else "base"


def violations(package_dirs: dict[str, Path]) -> list[str]:
    found = modules(package_dirs)
    graph = {name: imports(name, path, set(found)) for name, path in found.items()}
    problems = []
    for name, targets in sorted(graph.items()):
        stage = stage_of(name)
        for target in sorted(targets):
            if target.split(".")[0] in PYTEST_MODULES and stage != "plugin":
                problems.append(f"{name} imports {target}: only the pytest layer (plugin/) imports pytest")
            target_stage = stage_of(target)
            if target_stage == "outside":
                continue
            if target_stage == TESTING and stage != TESTING:
                problems.append(f"{name} imports {target}: no stage or library imports the testing helpers")
            elif stage == TESTING and target_stage in STAGES:
                problems.append(f"{name} imports {target}: the testing helpers import no stage of the plugin")
            elif stage in LIBRARIES and target_stage != stage:
                problems.append(f"{name} imports {target}: the {stage} library imports no stage of the plugin")
            elif stage in STAGES and target_stage in STAGES and STAGES.index(target_stage) > STAGES.index(stage):
                problems.append(f"{name} imports {target}: {stage}/ comes before {target_stage}/ in a call's path")
    problems += [f"import cycle: {' -> '.join(cycle)}" for cycle in cycles(graph)]
    return problems + judge_violations(found)


def judge_feature(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if parts[:2] == ["pytest_msprobe", "judge"] and len(parts) > 3 else None


def judge_violations(found: dict[str, Path]) -> list[str]:
    """A judge/ feature that imports (at run time) a feature after it in JUDGE_FEATURES."""
    problems = []
    for name, path in sorted(found.items()):
        feature = judge_feature(name)
        if feature is None:
            continue
        for target in sorted(imports(name, path, set(found), annotations=False)):
            target_feature = judge_feature(target)
            if target_feature is None or target_feature == feature:
                continue
            if target_feature not in JUDGE_FEATURES or JUDGE_FEATURES.index(target_feature) > JUDGE_FEATURES.index(
                feature
            ):
                problems.append(f"{name} imports {target}: judge/{feature}/ comes before judge/{target_feature}/")
    return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:  # noqa: C901  Tarjan's algorithm as written in the literature
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in graph:
                continue
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_imports_follow_a_calls_path():
    assert violations(PACKAGE_DIRS) == []


def test_every_subpackage_is_packaged():
    """pyproject.toml lists the packages a wheel holds: a subpackage left out is missing
    from every non-editable install (the editable one in this checkout still finds it)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]["setuptools"]["packages"])
    on_disk = {name for name, path in modules(PACKAGE_DIRS).items() if path.name == "__init__.py"}
    assert on_disk - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"


def test_every_subpackage_says_what_it_owns_and_may_import():
    for folder in [
        PACKAGE_DIRS["pytest_msprobe"],
        *sorted(p for p in PACKAGE_DIRS["pytest_msprobe"].rglob("*") if p.is_dir() and (p / "__init__.py").exists()),
    ]:
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text("utf-8"))) or ""
        assert len(doc) > 100, f"{folder}/__init__.py needs a docstring saying what the subpackage owns"
        if folder != PACKAGE_DIRS["pytest_msprobe"]:
            assert "May import" in doc, f"{folder}/__init__.py: say what the subpackage may import"


def _plant(tmp_path: Path, files: dict[str, str]) -> dict[str, Path]:
    for relative, text in files.items():
        path = tmp_path / "pytest_msprobe" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return {"pytest_msprobe": tmp_path / "pytest_msprobe"}


@pytest.mark.parametrize(
    "files,expected",
    [
        ({"dump/index.py": "from pytest_msprobe.run import replay\n", "run/replay.py": ""}, "dump/ comes before run/"),
        (
            {
                "run/replay.py": "def f():\n    from pytest_msprobe.results.run_files import x\n",
                "results/run_files.py": "",
            },
            "run/ comes before results/",
        ),
        ({"judge/check/call.py": "import pytest\n"}, "only the pytest layer"),
        (
            {"judge/verdict/judgement.py": "from pytest_msprobe.judge.check import call\n", "judge/check/call.py": ""},
            "judge/verdict/ comes before judge/check/",
        ),
        (
            {
                "judge/explore/search.py": "def f():\n    from pytest_msprobe.judge.gate import baseline\n",
                "judge/gate/baseline.py": "",
            },
            "judge/explore/ comes before judge/gate/",
        ),
        ({"private_apis.py": "from _pytest.pathlib import bestrelpath\n"}, "only the pytest layer"),
        ({"testing/faults.py": "import pytest\n"}, "only the pytest layer"),
        (
            {"judge/check/call.py": "from pytest_msprobe.testing import faults\n", "testing/faults.py": ""},
            "no stage or library imports the testing helpers",
        ),
        (
            {"standards/fast.py": "from pytest_msprobe.testing.faults import x\n", "testing/faults.py": ""},
            "no stage or library imports the testing helpers",
        ),
        (
            {"testing/faults.py": "from pytest_msprobe.run import replay\n", "run/replay.py": ""},
            "the testing helpers import no stage",
        ),
        (
            {"standards/fast.py": "from pytest_msprobe.dump import index\n", "dump/index.py": ""},
            "library imports no stage",
        ),
        (
            {"standards/fast.py": "from .single_run import X\n", "standards/single_run.py": "from . import fast\n"},
            "import cycle",
        ),
    ],
    ids=[
        "reading-imports-running",
        "lazy-running-imports-results",
        "pytest-outside-plugin",
        "judge-core-imports-a-feature",
        "judge-feature-imports-a-later-one",
        "pytest-privates-in-the-base-compat",
        "pytest-in-the-testing-helpers",
        "stage-imports-testing",
        "library-imports-testing",
        "testing-imports-stage",
        "library-imports-stage",
        "cycle",
    ],
)
def test_a_planted_violation_is_found(tmp_path, files, expected):
    found = violations(_plant(tmp_path, {"__init__.py": "", **files}))
    assert any(expected in problem for problem in found), found


def long_modules(package_dirs: dict[str, Path], root: Path, reasons: dict[str, str]) -> list[str]:
    """Each module over MAX_LINES that `reasons` gives no reason for (paths from `root`)."""
    lengths = {
        path.relative_to(root).as_posix(): len(path.read_text("utf-8").splitlines())
        for path in modules(package_dirs).values()
    }
    return [
        f"{path}: {count} lines (at most {MAX_LINES}): split it, or say in LONG_MODULES why it stays one"
        for path, count in sorted(lengths.items())
        if count > MAX_LINES and path not in reasons
    ]


def test_no_module_is_long_without_a_reason():
    assert long_modules({**PACKAGE_DIRS, **SCRIPT_DIRS}, ROOT, LONG_MODULES) == []


@pytest.mark.parametrize("path", sorted(LONG_MODULES))
def test_a_long_modules_reason_is_still_needed(path):
    assert len((ROOT / path).read_text("utf-8").splitlines()) > MAX_LINES, (
        f"{path} is short now: take it out of LONG_MODULES"
    )


@pytest.mark.parametrize(
    "lines,reasons,found",
    [
        (MAX_LINES + 1, {}, True),
        (MAX_LINES, {}, False),
        (MAX_LINES + 1, {"pytest_msprobe/judge/long.py": "a reason"}, False),
    ],
    ids=["long", "at-the-limit", "long-with-a-reason"],
)
def test_a_planted_long_module_is_found(tmp_path, lines, reasons, found):
    package = _plant(tmp_path, {"__init__.py": "", "judge/long.py": "x = 1\n" * lines})
    assert (
        any("pytest_msprobe/judge/long.py" in problem for problem in long_modules(package, tmp_path, reasons)) == found
    )


@pytest.mark.parametrize("folder", sorted(SCRIPT_DIRS))
def test_a_planted_long_script_is_found(tmp_path, folder):
    """A study, tool or benchmark past the cap is named as a module of the package is."""
    (tmp_path / folder).mkdir()
    (tmp_path / folder / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    assert long_modules({folder: tmp_path / folder}, tmp_path, {}) == [
        f"{folder}/long.py: {MAX_LINES + 1} lines (at most {MAX_LINES}): split it, or say in LONG_MODULES why it stays one"
    ]


@pytest.mark.parametrize("old", ["pytest_msprobe.outcome", "pytest_msprobe.report_writer", "pytest_msprobe.options"])
def test_the_flat_layouts_module_paths_are_gone(old):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)


@pytest.mark.parametrize(
    "package,name",
    [
        ("pytest_msprobe.dump", "read_index"),
        ("pytest_msprobe.results", "ResultRecord"),
        ("pytest_msprobe.scripts", "write_script"),
    ],
)
def test_a_subpackage_answers_no_old_module_attribute(package, name):
    assert not hasattr(importlib.import_module(package), name)


def test_new_import_paths_warn_nothing():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from pytest_msprobe.dump import values  # a submodule
        from pytest_msprobe.judge.check.outcome import AccuracyWarning  # noqa: F401 (imported to see that importing warns nothing)
    assert values.__name__ == "pytest_msprobe.dump.values"
