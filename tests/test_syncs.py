"""Host-device syncs in the counted work (issue 44): the CUDA runtime's sync events of a recorded
profile (tests/data/cuda_sync_traces.json, taken on an H100) counted by kind, the profiler's own
taken off, and the work gate comparing them exactly; on a GPU, the count itself."""

from __future__ import annotations

import functools
import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_distperf.ranks import counting
from pytest_distperf.ranks.counting import count_step, device_totals
from pytest_distperf.work import PhaseWork, Work, compare_work, work_cell

TRACES: dict[str, list[dict[str, Any]]] = json.loads(
    (Path(__file__).parent / "data" / "cuda_sync_traces.json").read_text()
)["traces"]
STEPS = 5  # each recorded trace holds five steps of the probe's loop


def test_each_kind_of_host_wait_is_counted_under_its_name() -> None:
    own = device_totals(TRACES["none"]).syncs  # the harness's flush and the profiler's stop
    assert own == {"device synchronize": 2}
    expected = {
        "device_synchronize": {"device synchronize": STEPS},
        "item": {"stream synchronize": STEPS},
        "nonzero": {"stream synchronize": STEPS},
        "cpu_copy": {"stream synchronize": STEPS},
        "mask": {"stream synchronize": STEPS},
        "event_synchronize": {"event synchronize": STEPS},
        "stream_synchronize": {"stream synchronize": STEPS},
        "wait_stream": {},  # the device waits on another stream, the host does not
    }
    for case, syncs in expected.items():
        seen = counting._without(device_totals(TRACES[case]), own).syncs
        assert seen == syncs, case


def test_kernels_and_their_time_come_from_the_same_trace() -> None:
    profiled = device_totals(TRACES["item"])
    kernels = [e for e in TRACES["item"] if e["cat"] == "kernel"]
    assert profiled.kernels == len(kernels) > 0
    assert profiled.seconds == pytest.approx(sum(e["dur"] for e in kernels) * 1e-6)


class _RecordedSession:
    """Stands for a profiler session on CPU: its trace is a recorded one."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events

    def stop(self) -> None:
        pass

    def export_chrome_trace(self, path: str) -> None:
        Path(path).write_text(json.dumps({"traceEvents": self.events}))


def test_a_training_steps_syncs_reach_its_counted_work(monkeypatch: pytest.MonkeyPatch) -> None:
    sessions = iter([TRACES["none"], TRACES["item"]])  # the empty session first, then the step
    fresh = functools.cache(counting._session_syncs.__wrapped__)  # this test's own empty session
    monkeypatch.setattr(counting, "_session_syncs", fresh)
    monkeypatch.setattr(counting, "_started", lambda: _RecordedSession(next(sessions)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    model = torch.nn.Linear(4, 4)
    counted = count_step(lambda: model(torch.ones(1, 4)).sum().backward(), queues_kernels=True)
    step = counted.work.step
    assert step is not None and step.syncs == {"stream synchronize": STEPS}
    assert step.kernels == device_totals(TRACES["item"]).kernels


def test_cpu_ranks_report_no_sync_count_rather_than_zero() -> None:
    model = torch.nn.Linear(4, 4)
    counted = count_step(lambda: model(torch.ones(1, 4)).sum().backward(), queues_kernels=False)
    assert counted.work.step is not None and counted.work.step.syncs is None
    assert "syncs" not in counted.work.to_json()["step"]


def _work(syncs: dict[str, float] | None) -> Work:
    phase = PhaseWork(
        {}, ops=100, flops=1e6, kernels=50 if syncs is not None else None, syncs=syncs
    )
    return Work(decode=phase, prefill=phase)


def test_more_syncs_fail_naming_the_kind_and_the_count() -> None:
    comparison = compare_work(_work({}), _work({"device synchronize": 24}), 0.02)
    assert comparison.more == (
        "host syncs per token: 0 -> 24 (device synchronize)",
        "host syncs per prefill: 0 -> 24 (device synchronize)",
    )


def test_fewer_syncs_say_the_baseline_is_stale() -> None:
    comparison = compare_work(_work({"stream synchronize": 2}), _work({"stream synchronize": 1}), 0)
    assert not comparison.more
    assert comparison.less[0] == "host syncs per token: 2 -> 1 (stream synchronize)"


def test_a_baseline_without_the_count_gets_a_note_not_a_change() -> None:
    comparison = compare_work(_work(None), _work({"stream synchronize": 1}), 0.02)
    assert not comparison.changes
    assert "recorded before they were counted" in comparison.notes[0]


@pytest.mark.parametrize(
    ("syncs", "message"),
    [
        ({"device synchronize": -1}, r"work\.decode\.syncs: field 'device synchronize' must be"),
        ([1, 2], r"work\.decode: field 'syncs' must be a JSON object"),
    ],
)
def test_a_bad_sync_count_in_a_stored_work_is_named(syncs: Any, message: str) -> None:
    data = _work({"device synchronize": 1}).to_json()
    data["decode"]["syncs"] = syncs
    with pytest.raises(ValueError, match=message):
        Work.from_json(data, "work")


def test_syncs_survive_json_and_show_in_the_work_cell() -> None:
    work = _work({"device synchronize": 24, "stream synchronize": 1})
    again = Work.from_json(json.loads(json.dumps(work.to_json())), "work")
    assert again == work
    assert work_cell(work) == "sync 25x"
    assert work_cell(_work(None)) == "-"


@pytest.mark.gpu
def test_an_item_per_token_in_a_users_loop_is_one_stream_sync_per_token() -> None:
    model = torch.nn.Linear(64, 64).cuda()
    prompt = torch.ones(1, 64, device="cuda")

    def generate(model: Any, prompt: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        tokens = []
        for _ in range(max_new_tokens):
            tokens.append(int(model(prompt)[0, 0].item() > 0))
        return torch.tensor([tokens])

    counted = counting.count_work(model, prompt, 4, generate=generate)
    assert counted.work.decode is not None
    assert counted.work.decode.syncs == {"stream synchronize": 1}


def test_the_profilers_note_on_clearing_events_cannot_fail_a_count() -> None:
    # The suite runs with warnings as errors, as a user's may: the count must not fail on it.
    with counting._quiet_profiler():
        warnings.warn(
            "Warning: Profiler clears events at the end of each cycle.", UserWarning, stacklevel=2
        )
    with pytest.raises(UserWarning), counting._quiet_profiler():
        warnings.warn("any other warning still reaches the user", UserWarning, stacklevel=2)
