"""The switch that turns the gates off for a test that is not about them: distperf(gates=...)
over --distperf-gates over the ini's distperf_gates. Off, a run is measured and reported (its
verdict says "off") and no check fails it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import FAKE_LAUNCH_CONFTEST

from pytest_distperf.judge.checks import Check, CheckStatus, Decision
from pytest_distperf.options import SettingError, gate_from_marker, resolve_settings


def test_the_gates_are_on_unless_turned_off() -> None:
    assert resolve_settings({}, {}).gates is True
    assert resolve_settings({"gates": "off"}, {}).gates is False
    assert resolve_settings({}, {"gates": "OFF"}).gates is False
    assert resolve_settings({"gates": "on"}, {"gates": "off"}).gates is True  # CLI over ini


@pytest.mark.parametrize(
    ("cli", "ini", "message"),
    [
        ({"gates": "maybe"}, {}, "command-line option --distperf-gates = 'maybe': expected on or "
         "off, got 'maybe'"),
        ({}, {"gates": "false"}, "ini option distperf_gates in /x/pytest.ini = 'false': expected "
         "on or off, got 'false'"),
    ],
)  # fmt: skip
def test_a_bad_value_names_itself_and_its_source(cli: dict, ini: dict, message: str) -> None:
    with pytest.raises(SettingError) as info:
        resolve_settings(cli, ini, ini_file="/x/pytest.ini")
    assert str(info.value) == message


def test_the_marker_beats_the_command_line() -> None:
    off = resolve_settings({"gates": "off"}, {})
    assert off.gate_value("gates", {}) is False
    assert off.gate_value("gates", gate_from_marker({"gates": True}, "t")) is True
    on = resolve_settings({}, {})
    assert on.gate_value("gates", gate_from_marker({"gates": False}, "t")) is False
    with pytest.raises(SettingError, match=r"t: distperf\(gates='no'\): gates must be True or"):
        gate_from_marker({"gates": "no"}, "t")


def _decision(threshold: CheckStatus, gates: bool) -> Decision:
    checks = [Check(name, CheckStatus.OK, "fine") for name in ("baseline", "relative_speed")]
    return Decision(
        Check("threshold", threshold, "too slow"), *checks, Check("memory", CheckStatus.OK, ""),
        gates=gates,
    )  # fmt: skip


def test_off_a_failed_check_is_reported_but_fails_nothing() -> None:
    on = _decision(CheckStatus.FAIL, gates=True)
    assert (on.failed, on.verdict) == (True, "FAIL (threshold)")
    assert "distperf threshold check failed:\ntoo slow" in on.failure_text()
    off = _decision(CheckStatus.FAIL, gates=False)
    assert (off.failed, off.verdict, off.failure_text()) == (False, "off; FAIL (threshold)", "")
    assert _decision(CheckStatus.OK, gates=False).verdict == "off"


# fsdp: its ranks exchange collectives, so the threshold is judged (replicated decode gets a note)
TESTS = """
import pytest

@pytest.mark.strategy("fsdp")
@pytest.mark.distperf(model="tiny", max_new_tokens=4)
def test_default(distperf):
    distperf.run()

@pytest.mark.strategy("fsdp")
@pytest.mark.distperf(model="tiny", max_new_tokens=4, gates=False)
def test_marked_off(distperf):
    distperf.run()

@pytest.mark.strategy("fsdp")
@pytest.mark.distperf(model="tiny", max_new_tokens=4, gates=True)
def test_marked_on(distperf):
    distperf.run()
"""


def _verdicts(report: str) -> dict[str, str]:
    rows = json.loads(Path(report).read_text())["results"]
    return {row["test_id"].split("::")[1].split("[")[0]: row["verdict"] for row in rows}


def test_a_run_far_below_its_threshold_fails_only_with_the_gates_on(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs faked ten times slower than their prediction (no rank starts)."""
    pytester.makeconftest(FAKE_LAUNCH_CONFTEST)
    pytester.makepyfile(TESTS)
    monkeypatch.setenv("FAKE_SLOWDOWN", "10")
    common = ("--distperf-accelerator=cpu", "--distperf-devices=2", "-p", "no:benchmark")
    result = pytester.runpytest(*common, "--distperf-json=on.json")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(["*distperf threshold check failed:*", "*of the modelled*"])
    # off: judged and reported all the same, failing nothing
    result.stdout.fnmatch_lines(["*off; FAIL (threshold) *test_marked_off[[]fsdp-2cpu[]]"])
    assert _verdicts("on.json") == {
        "test_default": "FAIL (threshold)",
        "test_marked_off": "off; FAIL (threshold)",
        "test_marked_on": "FAIL (threshold)",
    }
    rows = {r["test_id"]: r for r in json.loads(Path("on.json").read_text())["results"]}
    [off_row] = [r for name, r in rows.items() if "marked_off" in name]
    assert (
        off_row["threshold_status"] == "fail" and "of the modelled" in off_row["threshold_message"]
    )
    off = pytester.runpytest(*common, "--distperf-gates=off", "--distperf-json=off.json")
    off.assert_outcomes(passed=2, failed=1)  # the marker's gates=True wins
    assert _verdicts("off.json")["test_default"] == "off; FAIL (threshold)"
    pytester.makeini("[pytest]\ndistperf_gates = off\n")
    from_ini = pytester.runpytest(*common, "-k", "default")
    from_ini.assert_outcomes(passed=1, deselected=2)
    monkeypatch.setenv("FAKE_SLOWDOWN", "1")
    healthy = pytester.runpytest(*common, "--distperf-gates=on", "-k", "default")
    healthy.assert_outcomes(passed=1, deselected=2)
