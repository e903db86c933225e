"""Workers and devices: ids index into what the caller left visible, round robin over
the workers, and `-n` alone steals work."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pytest_msprobe.plugin import options, workers


@dataclass
class FakeBackend:
    name: str
    count: int

    def device_count(self) -> int:
        return self.count

    def describe(self, index: int = 0) -> str:
        return f"{self.name}:{index}"


def test_every_visible_device_by_default() -> None:
    assert workers.parse_device_ids(None, FakeBackend("npu", 4)) == [0, 1, 2, 3]
    assert workers.parse_device_ids(options.device_list(""), FakeBackend("cpu", 1)) == [0]


def test_ids_count_within_the_callers_visible_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "4,5,6,7")
    npu = FakeBackend("npu", 4)  # what torch_npu reports under that restriction
    assert workers.parse_device_ids(options.device_list("2,3"), npu) == [2, 3]
    with pytest.raises(
        pytest.UsageError,
        match=r"no npu device 4; 4 are visible, numbered 0\.\.3 \(ASCEND_RT_VISIBLE_DEVICES='4,5,6,7'",
    ):
        workers.parse_device_ids(options.device_list("0,4"), npu)


@pytest.mark.parametrize("raw", ["a,b", "0;1", ",", "-1"])
def test_bad_device_lists_say_what_is_expected(raw: str) -> None:
    with pytest.raises(pytest.UsageError, match="--msprobe-devices"):
        workers.parse_device_ids(options.device_list(raw), FakeBackend("cuda", 2))


def test_workers_go_round_robin_over_the_ids() -> None:
    assert [workers.device_of([2, 3], k) for k in range(5)] == [2, 3, 2, 3, 2]
    assert workers.device_of([5], None) == 5  # no xdist: the first id


def test_workers_share_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert [workers.thread_share(n) for n in (1, 2, 8, 32)] == [16, 8, 2, 1]
    assert [workers.replay_threads(False, n) for n in (1, 8)] == [16, 2]  # a share per device in use, whatever -n
    assert [workers.replay_threads(True, n) for n in (1, 8)] == [1, 1]  # the CPU only: one thread in every process


def _dump(pytester: pytest.Pytester) -> str:
    pytester.path.joinpath("dump").mkdir()
    pytester.path.joinpath("dump", "dump.json").write_text(
        '{"task": "statistics", "level": "L1", "framework": "pytorch", "data": {"Torch.exp.0.forward": '
        '{"input_args": [{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "Max": 1, "Min": 0, '
        '"Mean": 0.5, "Norm": 1, "requires_grad": false}], "input_kwargs": {}, "output": []}}}'
    )
    return "--msprobe-dump=dump"


@pytest.mark.parametrize(
    ("args", "dist"), [(("-n", "2"), "worksteal"), (("-n", "2", "--dist", "load"), "load"), (("-n", "2", "-d"), "load")]
)
def test_n_alone_steals_work(pytester: pytest.Pytester, args: tuple[str, ...], dist: str) -> None:
    result = pytester.runpytest(_dump(pytester), "--co", "-p", "no:cacheprovider", *args)
    result.stdout.fnmatch_lines([f"msprobe: 2 workers, dist={dist}; host *: gw0->cpu, gw1->cpu; 1 CPU thread(s) each"])


def test_the_cpu_has_one_device(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(_dump(pytester), "--co", "--msprobe-devices=0,1")
    result.stderr.fnmatch_lines(["*--msprobe-devices '0,1': there is no cpu device 1; 1 is visible, numbered 0..0*"])
