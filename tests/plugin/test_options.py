"""The options read once into one typed value (plugin/options.py, from the table of
plugin/option_table.py), and the one rule of every path option: a value on the command
line is relative to the current folder, one in an ini file (here pyproject.toml's
[tool.pytest.ini_options]) to that file's folder.

Each path option is given relative in pyproject.toml and pytest runs from a subfolder:
what the option writes must land beside pyproject.toml, and what it reads is read from
there (a broken decoy at the same relative path under the subfolder fails the run if it
is read instead)."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch  # noqa: F401 - kept loaded: pytester drops the modules an in-process run imported, and a second import of torch crashes

from pytest_msprobe.plugin import option_table, options

ROPE = "npu_rope_statistics_fp16"  # 3 calls: Torch.cat.8.forward and two more
# a conftest's standard that fails `cat`: a failed call for --msprobe-save-failed
FAILING_CAT = """
def pytest_msprobe_register_standards(registry):
    def planted(pair, thresholds, reference=None):
        return pair.verdict("error", "planted", {"cosine": -0.5}, {}, ["planted"])

    registry.register_standard("planted", planted)
    registry.set_api_standard("cat", "planted")
"""


def test_the_options_value_has_a_field_per_option() -> None:
    """A field per option of the table, named without `msprobe_`, and the HTML report's
    label of the recorded metrics: an option added to one and not the other fails here."""
    fields = {field.name for field in dataclasses.fields(options.Options)}
    assert fields == {option.name.removeprefix("msprobe_") for option in option_table.OPTIONS} | {"reference_label"}
    path_options = {option.name for option in option_table.OPTIONS if option.kind == "path"}
    assert {"msprobe_out", "msprobe_scripts", "msprobe_html", "msprobe_baseline"} <= path_options


def test_the_options_are_read_once_typed_and_frozen(pytester: pytest.Pytester, dumps: Path) -> None:
    shutil.copytree(dumps / ROPE, pytester.path / "rope")
    run = pytester.inline_run(
        "--msprobe-dump=rope", "--msprobe-device=cpu", "--msprobe-shard=1/4", "--msprobe-black-list=a, b", "--co"
    )
    chosen = options.of(run.getcall("pytest_collection_finish").session.config)
    assert chosen.dump == ((pytester.path / "rope" / "dump.json").resolve(),) and chosen.device == "cpu"
    assert chosen.out == pytester.path / "msprobe-out" and chosen.timeout == 300.0 and chosen.devices is None
    assert chosen.shard == (1, 4) and chosen.black_list == ("a", "b") and chosen.html is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        chosen.out = Path("elsewhere")  # type: ignore[misc]


def test_device_lists_are_read_into_ids() -> None:
    assert options.device_list("0, 2") == (0, 2) and options.device_list("") is None
    with pytest.raises(pytest.UsageError, match="--msprobe-devices 'a,b': expected device ids"):
        options.device_list("a,b")


def written(root: Path, name: str) -> Path:
    return root / "results" / name


# option: (its value in pyproject.toml, what lands beside pyproject.toml)
WRITTEN = {
    "msprobe_out": ("results/out", lambda root: next(written(root, "out").glob("msprobe_records_*.jsonl"))),
    "msprobe_baseline_save": ("results/saved", lambda root: written(root, "saved") / "msprobe-baseline.jsonl"),
    "msprobe_scripts": ("results/scripts", lambda root: written(root, "scripts") / "Torch.cat.8.forward.py"),
    "msprobe_html": ("results/report.html", lambda root: written(root, "report.html")),
    "msprobe_save_failed": ("results/failed", lambda root: next(written(root, "failed").iterdir())),
}


def project(pytester: pytest.Pytester, dumps: Path, monkeypatch: pytest.MonkeyPatch, lines: dict[str, str]) -> Path:
    """A project of the rope dump whose pyproject.toml names these options; the current
    folder is its subfolder `sub`, which is returned."""
    if not (pytester.path / "rope").exists():
        shutil.copytree(dumps / ROPE, pytester.path / "rope")
        pytester.makeconftest(FAILING_CAT)
    settings = {"msprobe_dump": "rope", "msprobe_device": "cpu", **lines}
    pytester.makepyprojecttoml(
        "[tool.pytest.ini_options]\n" + "".join(f'{name} = "{value}"\n' for name, value in settings.items())
    )
    sub = pytester.path / "sub"
    sub.mkdir(exist_ok=True)
    monkeypatch.chdir(sub)
    return sub


@pytest.mark.parametrize("name", sorted(WRITTEN))
def test_a_relative_output_path_in_pyproject_lands_beside_it(
    pytester: pytest.Pytester, dumps: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    value, lands = WRITTEN[name]
    lines = {name: value, "msprobe_scripts_all": "true"} if name == "msprobe_scripts" else {name: value}
    sub = project(pytester, dumps, monkeypatch, lines)
    result = pytester.runpytest("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=2, failed=1)  # cat fails by the conftest's standard
    assert lands(pytester.path).exists(), result.stdout.str()
    assert not (sub / "results").exists()


def test_the_html_report_links_the_scripts_where_pyproject_put_them(
    pytester: pytest.Pytester, dumps: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both relative in pyproject.toml: the report names each script at the path the
    scripts were written to, not under the current folder."""
    project(pytester, dumps, monkeypatch, {"msprobe_html": "results/report.html", "msprobe_scripts": "results/scripts"})
    pytester.runpytest("-p", "no:cacheprovider", "-q").assert_outcomes(passed=2, failed=1)
    script = written(pytester.path, "scripts") / "Torch.cat.8.forward.py"
    assert script.exists()
    assert f"python {script}" in written(pytester.path, "report.html").read_text(encoding="utf-8")


def make_baseline(pytester: pytest.Pytester, dumps: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A baseline of the rope dump in inputs/baseline, recorded from the project's folder."""
    project(pytester, dumps, monkeypatch, {"msprobe_out": "first", "msprobe_baseline_save": "inputs/baseline"})
    pytester.runpytest("-p", "no:cacheprovider", "-q").assert_outcomes(
        passed=2, failed=1
    )  # cat, by the conftest's standard


# option: (its value in pyproject.toml, what to write at it (folder, file, text), a broken
# file at the same path under the current folder)
READ = {
    "msprobe_standards": ("inputs/standards.csv", "api,standard\n", "api,standard\nlinear,nosuch\n"),
    "msprobe_config": (
        "inputs/config.json",
        '{"acc_check": {"black_list": ["silu"]}}',
        '{"acc_check": {"white_list": "linear"}}',
    ),
    "msprobe_reference_csv": ("inputs/details.csv", "API Name\n", "nothing,here\n1,2\n"),
    "msprobe_baseline": ("inputs/baseline", None, '{"format": "pytest-msprobe-baseline", "version": 99}\n'),
}


@pytest.mark.parametrize("name", sorted(READ))
def test_a_relative_input_path_in_pyproject_is_read_beside_it(
    pytester: pytest.Pytester, dumps: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    value, text, decoy = READ[name]
    if text is None:  # a folder: the baseline
        make_baseline(pytester, dumps, monkeypatch)
    sub = project(pytester, dumps, monkeypatch, {name: value})
    if text is None:
        (sub / value).mkdir(parents=True)
        (sub / value / "msprobe-baseline.jsonl").write_text(decoy)
    else:
        (pytester.path / value).parent.mkdir(exist_ok=True)
        (pytester.path / value).write_text(text)
        (sub / value).parent.mkdir()
        (sub / value).write_text(decoy)
    result = pytester.runpytest("-p", "no:cacheprovider", "-q")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str() + result.stderr.str()  # cat only
    result.assert_outcomes(passed=2, failed=1)


def test_a_relative_dump_in_pyproject_is_found_beside_it(
    pytester: pytest.Pytester, dumps: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sub = project(pytester, dumps, monkeypatch, {})
    (sub / "rope").mkdir()  # a folder without a dump.json: a usage error if it were read
    result = pytester.runpytest("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=2, failed=1)
