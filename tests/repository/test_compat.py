"""Every private API of another project that the plugin (or its tests and benchmarks)
uses is where the plugin reaches it, in the installed versions: an upgrade that moves
one fails here, naming the API, the version and what the plugin used it for, not
somewhere deep in a replay or a search.

The package reaches them only through its compat modules (pytest_msprobe/private_apis.py,
pytest_msprobe/plugin/pytest_privates.py), which list them; the tests and benchmarks use a few
more, listed here. Both are found by reading the source with `ast`, so a new private
name used anywhere without a check here fails too.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import inspect
import platform
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from pytest_msprobe import private_apis as compat
from pytest_msprobe.plugin import pytest_privates as plugin_compat
from pytest_msprobe.private_apis import PrivateApi

ROOT = Path(__file__).resolve().parents[2]
FIRST_PARTY = ("pytest_msprobe", "standards", "bench_functions", "tests", "benchmarks", "studies", "tools")
PACKAGE = ("pytest_msprobe", "standards", "bench_functions")
COMPAT_MODULES = (
    ROOT / "pytest_msprobe" / "private_apis.py",
    ROOT / "pytest_msprobe" / "plugin" / "pytest_privates.py",
)
# shipped beside the plugin but not part of it: its planted kernels use private APIs as the tests do
TESTING = ROOT / "pytest_msprobe" / "testing"
# the few underscore names that are public API: os._exit, a namedtuple's methods
PUBLIC_UNDERSCORE = {"_exit", "_replace", "_asdict", "_fields", "_make"}
# what the tests and benchmarks reach besides the package's (where: the first user)
TESTS_PRIVATE_APIS = (
    PrivateApi(
        "_pytest.pytester.SysModulesSnapshot", "pytest", "tests/mindspore_replay/conftest.py: keeps MindSpore loaded"
    ),
    PrivateApi(
        "torch.ops.aten._to_copy", "torch", "pytest_msprobe/testing/backward_faults.py: a planted kernel's dtype casts"
    ),
    PrivateApi("torch.nn.GRU._flat_weights", "torch", "tests/dumps/models/make_dumps.py: torch.gru's weights list"),
    PrivateApi("torch._dynamo.config.cache_size_limit", "torch", "studies/family_recompute.py: more compiled variants"),
)
ALL_APIS = (*compat.PRIVATE_APIS, *plugin_compat.PRIVATE_APIS, *TESTS_PRIVATE_APIS)
# an instance attribute: read from an instance the class makes
INSTANCES: dict[str, Callable[[], object]] = {
    "torch.nn.GRU": lambda: torch.nn.GRU(2, 2),
    "torch.storage.TypedStorage": lambda: torch.zeros(2)._typed_storage(),
}
# what each callable is called with: its leading parameters, as the plugin passes them
PARAMETERS = {
    "torch.autograd.graph._engine_run_backward": ("t_outputs", "args", "kwargs"),
    "torch.Tensor._typed_storage": ("self",),
    "hypothesis.internal.conjecture.providers._get_local_constants": (),
    "threading._shutdown": (),
    "_pytest.pathlib.bestrelpath": ("directory", "dest"),
    "_pytest.pytester.SysModulesSnapshot": ("preserve",),
}


def _version(distribution: str) -> str:
    if distribution == "python":
        return platform.python_version()
    return importlib.metadata.version(distribution)


def _moved(api: PrivateApi, problem: str) -> str:
    return (
        f"{api.name} {problem} in {api.distribution} {_version(api.distribution)}; the plugin uses it for {api.use}. "
        "Change pytest_msprobe/private_apis.py (pytest's: plugin/pytest_privates.py) and the tested range in pyproject.toml"
    )


def _api(name: str) -> PrivateApi:
    return next(api for api in ALL_APIS if api.name == name)


def _resolve(api: PrivateApi) -> object:
    """The object a dotted name names: the longest importable module, then attributes."""
    parts = api.name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for depth, attribute in enumerate(parts[cut:], start=cut):
            owner = ".".join(parts[:depth])
            found = INSTANCES[owner]() if owner in INSTANCES else found
            if not hasattr(found, attribute):
                pytest.fail(_moved(api, f"is gone: {owner} has no {attribute!r}"))
            found = getattr(found, attribute)
        return found
    pytest.fail(_moved(api, "is gone: no module of it imports"))


@pytest.mark.parametrize("api", ALL_APIS, ids=[api.name for api in ALL_APIS])
def test_each_private_api_is_where_the_plugin_reaches_it(api: PrivateApi) -> None:
    if api.distribution == "torch_npu":
        pytest.importorskip("torch_npu")
    if api.read_by:
        source = inspect.getsource(importlib.import_module(api.read_by))
        assert api.name in source, _moved(api, f"is no longer read by {api.read_by}")
        return
    found = _resolve(api)
    if api.name in PARAMETERS:
        parameters = tuple(inspect.signature(found).parameters)  # type: ignore[arg-type]
        expected = PARAMETERS[api.name]
        assert parameters[: len(expected)] == expected, _moved(api, f"takes {parameters}, not {expected}")


def test_every_checked_signature_is_of_a_listed_api() -> None:
    assert set(PARAMETERS) <= {api.name for api in ALL_APIS}


@pytest.mark.parametrize("local", ["", "+cu130"], ids=["plain", "CUDA build"])
def test_a_moved_api_is_named_with_its_version(monkeypatch: pytest.MonkeyPatch, local: str) -> None:
    """Named with the installed distribution's version, as the message prints it: under
    a CUDA build torch.__version__ carries a local suffix (`2.14.1+cu130`) that the
    distribution's version may not, so the test compares with what is printed."""
    installed = importlib.metadata.version("torch")
    monkeypatch.setattr(torch, "__version__", installed.partition("+")[0] + local)
    gone = PrivateApi("torch.autograd.graph._no_such_entry", "torch", "nothing")
    with pytest.raises(pytest.fail.Exception, match=rf"_no_such_entry is gone: .* in torch {re.escape(installed)};"):
        _resolve(gone)


def test_the_engines_backward_gives_autograds_gradients() -> None:
    engine_run = compat.engine_run_backward()
    engine = _api("torch.autograd.graph._engine_run_backward")
    assert engine_run is not None, _moved(engine, "is gone")
    x, g = torch.linspace(-1, 1, 6, requires_grad=True), torch.linspace(0.5, 2, 6)
    torch.autograd.backward([x.sin()], [g])
    expected, x.grad = x.grad, None
    engine_run((x.sin(),), (g,), False, False, (), allow_unreachable=True, accumulate_grad=True)
    assert torch.equal(x.grad, expected), _moved(engine, "gives other gradients than torch.autograd.backward")


def test_a_tensor_file_is_read_into_an_untyped_storage(tmp_path: Path) -> None:
    torch.save(torch.arange(4.0), tmp_path / "t.pt")
    reader = compat.file_reader()
    assert reader is not None, _moved(_api("torch._C.PyTorchFileReader"), "is gone")
    archive = reader(str(tmp_path / "t.pt"))
    rebuild = _api("torch._utils._rebuild_tensor_v2")
    assert b"_rebuild_tensor_v2" in archive.get_record("data.pkl"), _moved(
        rebuild, "is not what torch.save pickles a tensor as"
    )
    storage = compat.record_storage(archive.get_storage_from_record("data/0", 16, torch.UntypedStorage))  # type: ignore[arg-type]
    untyped = _api("torch.storage.TypedStorage._untyped_storage")
    assert isinstance(storage, torch.UntypedStorage) and storage.nbytes() == 16, _moved(
        untyped, f"is a {type(storage)}"
    )


def _draws(seed: int) -> list[int]:
    from hypothesis import Phase, given, settings
    from hypothesis import strategies as st

    drawn: list[int] = []

    def probe(value: int) -> None:
        drawn.append(value)

    compat.seed_search(probe, seed)
    settings(max_examples=5, database=None, phases=[Phase.generate])(given(st.integers())(probe))()
    return drawn


def test_a_seeded_search_draws_the_same_examples_and_another_seed_others() -> None:
    seeded = _api("_hypothesis_internal_use_seed")
    assert _draws(7) == _draws(7), _moved(seeded, "no longer seeds a test: the same seed drew other examples")
    assert _draws(7) != _draws(8), _moved(seeded, "no longer seeds a test: two seeds drew the same examples")


def test_the_database_is_keyed_by_the_added_digest(tmp_path: Path) -> None:
    from hypothesis import Phase, given, settings
    from hypothesis import strategies as st
    from hypothesis.database import DirectoryBasedExampleDatabase

    def failing(value: int) -> None:
        raise AssertionError

    def keys_after(key: bytes) -> set[str]:
        test = settings(database=DirectoryBasedExampleDatabase(tmp_path), phases=[Phase.generate])(
            given(st.integers())(failing)
        )
        compat.key_database(test, key)
        with pytest.raises(AssertionError):
            test()
        return {path.name for path in tmp_path.iterdir() if not path.name.startswith(".")}

    first = keys_after(b"one call")
    keyed = _api("_hypothesis_internal_add_digest")
    assert keys_after(b"one call") == first, _moved(keyed, "no longer keys the database: one key saved under another")
    assert keys_after(b"another call") > first, _moved(keyed, "no longer keys the database: two keys saved under one")


def test_a_search_sees_no_local_constants() -> None:
    from hypothesis.internal.conjecture import providers

    with compat.no_local_constants():
        local = _api("hypothesis.internal.conjecture.providers._get_local_constants")
        assert providers._get_local_constants() == providers.Constants(), _moved(
            local, "still gives local constants when patched"
        )
        assert not providers.CONSTANTS_CACHE, _moved(
            _api("hypothesis.internal.conjecture.providers.CONSTANTS_CACHE"), "is not emptied"
        )


def test_ending_a_process_waits_for_its_threads_and_runs_its_exit_handlers() -> None:
    """In a process of its own: threading._shutdown marks the main thread stopped."""
    script = (
        "import atexit, os, threading, time\n"
        "from pytest_msprobe.private_apis import join_threads, run_exit_handlers\n"
        "thread = threading.Thread(target=time.sleep, args=(0.2,))\n"
        "thread.start()\n"
        "atexit.register(print, 'exit handler ran', flush=True)\n"
        "join_threads()\n"
        "print('thread alive:', thread.is_alive(), flush=True)\n"
        "run_exit_handlers()\n"
        "os._exit(0)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    moved = f"{_moved(_api('threading._shutdown'), 'or atexit._run_exitfuncs moved')}: {done.stderr}"
    assert done.returncode == 0, moved
    assert done.stdout.splitlines() == ["thread alive: False", "exit handler ran"], moved


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _defined(trees: list[ast.Module]) -> set[str]:
    """The names the project's own code defines: functions, classes, variables, parameters,
    and attributes it sets on self/cls (an attribute set on another object is not its own)."""
    found = set()
    for node in (node for tree in trees for node in ast.walk(tree)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            found.add(node.id)
        elif isinstance(node, ast.arg):
            found.add(node.arg)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name):
            found.update([node.attr] if node.value.id in ("self", "cls") else [])
    return found


def _private_uses(tree: ast.Module, own: set[str]) -> Iterator[tuple[int, str]]:
    """(line, name) of each private name of another project the module uses: a private
    module imported, a private attribute read or set, or named to getattr/patch.object."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and node.module
            and node.module.split(".")[0] not in FIRST_PARTY
        ):
            modules = node.module.split(".")
            if any(_private(part) or part == "internal" for part in modules):
                yield node.lineno, node.module
            yield from ((node.lineno, alias.name) for alias in node.names if _private(alias.name))
        elif isinstance(node, ast.Import):
            yield from (
                (node.lineno, alias.name)
                for alias in node.names
                if any(_private(part) for part in alias.name.split("."))
            )
        elif isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in own | PUBLIC_UNDERSCORE:
            yield node.lineno, node.attr
        elif isinstance(node, ast.Call) and len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
            called = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            name = node.args[1].value
            if (
                called in ("getattr", "hasattr", "setattr", "object")
                and isinstance(name, str)
                and _private(name)
                and name not in own
            ):
                yield node.lineno, name


def _listed(name: str, apis: tuple[PrivateApi, ...]) -> bool:
    parts = name.split(".")
    return any(
        api.name.split(".")[i : i + len(parts)] == parts for api in apis for i in range(len(api.name.split(".")))
    )


def private_uses(files: list[Path]) -> list[tuple[Path, int, str]]:
    trees = {path: ast.parse(path.read_text("utf-8")) for path in files}
    own = _defined(list(trees.values()))
    return [(path, line, name) for path, tree in trees.items() for line, name in _private_uses(tree, own)]


def _sources() -> list[Path]:
    folders = [ROOT / folder for folder in (*PACKAGE, "tests", "benchmarks", "studies", "tools")]
    return sorted(path for folder in folders for path in folder.rglob("*.py"))


def test_the_package_reaches_private_apis_only_through_its_compat_modules() -> None:
    found = private_uses(_sources())
    outside = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path, line, name in found
        if path.parts[len(ROOT.parts)] in PACKAGE and TESTING not in path.parents
    ]
    outside = [
        use for use in outside if not any(use.startswith(str(module.relative_to(ROOT))) for module in COMPAT_MODULES)
    ]
    assert outside == [], (
        "use these through pytest_msprobe/private_apis.py (pytest's through plugin/pytest_privates.py)"
    )


def test_every_private_api_used_is_listed_and_checked() -> None:
    unlisted = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path, line, name in private_uses(_sources())
        if not _listed(name, ALL_APIS)
    ]
    assert unlisted == [], "list each in compat.PRIVATE_APIS (the tests' and benchmarks' in TESTS_PRIVATE_APIS here)"


@pytest.mark.parametrize(
    "source,expected",
    [
        ("import torch\ntorch._C._tensor_list()\n", "_tensor_list"),
        ("from _pytest.pathlib import bestrelpath\n", "_pytest.pathlib"),
        ("from hypothesis.internal.conjecture import providers\n", "hypothesis.internal.conjecture"),
        ("def f(test):\n    test._hypothesis_internal_use_seed = 1\n", "_hypothesis_internal_use_seed"),
        ("import threading\nshutdown = getattr(threading, '_shutdown', None)\n", "_shutdown"),
    ],
    ids=["attribute", "private-module", "internal-module", "attribute-set-on-another-object", "getattr"],
)
def test_a_planted_private_use_is_found(tmp_path: Path, source: str, expected: str) -> None:
    (tmp_path / "planted.py").write_text(source)
    (tmp_path / "own.py").write_text(
        "class Own:\n    def __init__(self):\n        self._mine = 1\n\n    def read(self):\n        return self._mine\n"
    )
    found = private_uses([tmp_path / "planted.py", tmp_path / "own.py"])
    assert expected in [name for _, _, name in found]
    assert [path.name for path, _, _ in found if path.name != "planted.py"] == []  # its own private names are its own
