from __future__ import annotations

import pytest

from pytest_distperf.options import (
    SettingError,
    Workload,
    env_slowdown,
    gate_from_marker,
    resolve_settings,
    workload_from_marker,
)

MODELS = ("tiny", "pythia-14m")


def test_defaults() -> None:
    settings = resolve_settings({}, {})
    assert (settings.devices, settings.accelerator, settings.repeats) == (2, "auto", 5)
    assert (settings.warmup, settings.timeout) == (1, 600.0)


def test_cli_beats_ini_beats_default() -> None:
    settings = resolve_settings({"repeats": "7"}, {"repeats": "3", "warmup": "2"})
    assert settings.repeats == 7
    assert settings.warmup == 2


def test_devices_auto_is_resolved_later() -> None:
    assert resolve_settings({"devices": "auto"}, {}).devices is None


@pytest.mark.parametrize("bad", ["0", "-3", "abc", "1.5"])
def test_bad_devices_names_value_and_flag(bad: str) -> None:
    with pytest.raises(SettingError) as info:
        resolve_settings({"devices": bad}, {})
    assert "--distperf-devices" in str(info.value)
    assert repr(bad) in str(info.value)


def test_bad_ini_value_names_ini_file() -> None:
    with pytest.raises(SettingError, match=r"distperf_timeout in /x/pytest.ini.*'-1'"):
        resolve_settings({}, {"timeout": "-1"}, ini_file="/x/pytest.ini")


def test_bad_accelerator_lists_choices() -> None:
    with pytest.raises(SettingError, match="'tpu' is not one of auto, cpu, cuda"):
        resolve_settings({"accelerator": "tpu"}, {})


def test_numa_binding_is_off_unless_asked_and_checked() -> None:
    assert resolve_settings({}, {}).numa_binding is None
    assert resolve_settings({"numa_binding": "Exclusive"}, {}).numa_binding == "exclusive"
    with pytest.raises(
        SettingError,
        match="--distperf-numa-binding = 'numa'.*not one of node, socket, exclusive, core-complex",
    ):
        resolve_settings({"numa_binding": "numa"}, {})


def test_workload_from_marker_defaults_and_values() -> None:
    workload = workload_from_marker({"model": "pythia-14m", "max_new_tokens": 4}, "t", MODELS)
    assert workload == Workload(model="pythia-14m", max_new_tokens=4)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"model": "gpt-5"}, r"model='gpt-5'.*valid: tiny, pythia-14m"),
        ({"precision": "int4"}, r"precision='int4'.*fp32, bf16, fp16"),
        ({"max_new_tokens": 0}, r"max_new_tokens=0"),
        ({"batch_size": "2"}, r"batch_size='2'"),
        ({"seed": 1.5}, r"seed=1.5"),
        ({"slowdown": 1.0}, r"slowdown=1.0"),
        ({"temperature": 0.7}, r"unknown distperf marker argument\(s\) temperature"),
    ],
)
def test_bad_marker_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(SettingError, match=message) as info:
        workload_from_marker(kwargs, "tests/test_x.py::test_y", MODELS)
    assert str(info.value).startswith("tests/test_x.py::test_y")


def test_env_slowdown() -> None:
    assert env_slowdown({}) is None
    assert env_slowdown({"DISTPERF_SLOWDOWN": "0.5"}) == 0.5
    with pytest.raises(SettingError, match="DISTPERF_SLOWDOWN='2'"):
        env_slowdown({"DISTPERF_SLOWDOWN": "2"})


@pytest.mark.parametrize("bad", ["inf", "nan", "0"])
def test_timeout_must_be_finite_and_positive(bad: str) -> None:
    with pytest.raises(SettingError, match=f"--distperf-timeout = '{bad}'"):
        resolve_settings({"timeout": bad}, {})


def test_alpha_and_switches() -> None:
    settings = resolve_settings({"alpha": "0.05", "strict": True}, {"update_baselines": "true"})
    assert (settings.alpha, settings.strict, settings.update_baselines) == (0.05, True, True)
    with pytest.raises(SettingError, match="alpha must be in"):
        resolve_settings({"alpha": "1"}, {})
    with pytest.raises(SettingError, match=r"distperf_strict in t.ini = 'maybe'.*true or false"):
        resolve_settings({}, {"strict": "maybe"}, ini_file="t.ini")


def test_marker_beats_command_line_beats_ini() -> None:
    """The most specific setting wins (pytest-timeout's rule): marker > CLI > ini > default."""
    marker = {"efficiency": 0.3}
    assert resolve_settings({}, {}).gate_value("efficiency", {}) == 0.7
    from_ini = resolve_settings({}, {"efficiency": "0.5"})
    assert from_ini.gate_value("efficiency", {}) == 0.5
    from_cli = resolve_settings({"efficiency": "0.9"}, {"efficiency": "0.5"})
    assert from_cli.gate_value("efficiency", {}) == 0.9
    assert from_cli.gate_value("efficiency", marker) == 0.3
    assert from_ini.gate_value("efficiency", marker) == 0.3


def test_launched_job_from_torchrun_variables() -> None:
    from pytest_distperf.launch.job import launched_job

    assert launched_job({}) is None
    job = launched_job({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"})
    assert (job.rank, job.world_size, job.nodes) == (1, 4, 2)
    with pytest.raises(ValueError, match="RANK='x' / WORLD_SIZE='2'"):
        launched_job({"RANK": "x", "WORLD_SIZE": "2"})


def test_launched_job_from_srun_variables() -> None:
    from pytest_distperf.launch.job import launched_job

    srun = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1"}
    assert launched_job(srun) is None  # an interactive allocation: no rendezvous address
    srun |= {"MASTER_ADDR": "node1", "MASTER_PORT": "29500", "SLURM_TASKS_PER_NODE": "2(x2)"}
    job = launched_job(srun)
    assert (job.rank, job.world_size, job.local_rank, job.nodes) == (3, 4, 1, 2)
    assert job.launcher == "srun"
    assert job.environment() == {
        "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"
    }  # fmt: skip
    with pytest.raises(ValueError, match="SLURM_PROCID='one'"):
        launched_job({**srun, "SLURM_PROCID": "one"})
    with pytest.raises(ValueError, match=r"SLURM_TASKS_PER_NODE='2,1' .*same number of tasks"):
        launched_job({**srun, "SLURM_TASKS_PER_NODE": "2,1"})
    with pytest.raises(ValueError, match=r"SLURM_PROCID=4 must be in \[0, SLURM_NTASKS=4\)"):
        launched_job({**srun, "SLURM_PROCID": "4"})


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"RANK": "2"}, r"RANK=2 must be in \[0, WORLD_SIZE=2\)"),
        ({"WORLD_SIZE": "0", "RANK": "0"}, r"WORLD_SIZE=0 must be >= 1"),
        ({"LOCAL_WORLD_SIZE": "0"}, r"LOCAL_WORLD_SIZE=0 must be in \[1, WORLD_SIZE\]"),
        ({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "1"}, r"LOCAL_RANK=1 must be in \[0, LOCAL_"),
    ],
)
def test_a_launched_jobs_numbers_must_agree(changes: dict[str, str], message: str) -> None:
    from pytest_distperf.launch.job import launched_job

    torchrun = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "1"}
    assert launched_job(torchrun) is not None
    with pytest.raises(ValueError, match=message + ".*from the environment"):
        launched_job({**torchrun, **changes})


def test_count_and_work_tolerance() -> None:
    settings = resolve_settings({}, {})
    assert (settings.count, settings.work_tolerance) == (True, 0.01)
    assert resolve_settings({"count": "OFF"}, {}).count is False
    assert resolve_settings({}, {"count": "off"}).count is False
    assert resolve_settings({}, {"work_tolerance": "0"}).work_tolerance == 0.0
    marker = {"work_tolerance": 0.2}
    assert resolve_settings({"work_tolerance": "0.05"}, {}).gate_value("work_tolerance", {}) == 0.05
    assert resolve_settings({}, {}).gate_value("work_tolerance", marker) == 0.2
    assert gate_from_marker(marker, "t") == marker


def test_relative_speed_option_ini_and_marker_twins() -> None:
    # Off by default: replicated strategies time no bare model beside their repeats.
    assert resolve_settings({}, {}).relative_speed is False
    assert resolve_settings({"relative_speed": True}, {}).relative_speed is True
    assert resolve_settings({}, {"relative_speed": "true"}).relative_speed is True
    off = resolve_settings({}, {})
    marker = gate_from_marker({"relative_speed": True}, "t")
    assert marker == {"relative_speed": True}
    assert off.gate_value("relative_speed", marker) is True  # the marker wins
    on = resolve_settings({}, {"relative_speed": "1"})
    assert on.gate_value("relative_speed", gate_from_marker({"relative_speed": False}, "t")) is (
        False
    )
    bad = r"t: distperf\(relative_speed='yes'\): relative_speed must be True or False"
    with pytest.raises(SettingError, match=bad):
        gate_from_marker({"relative_speed": "yes"}, "t")
    with pytest.raises(SettingError, match="ini option distperf_relative_speed.*'sometimes'"):
        resolve_settings({}, {"relative_speed": "sometimes"})
    # a valid marker argument, not a workload field
    workload = workload_from_marker({"relative_speed": True}, "t", MODELS)
    assert "relative_speed" not in workload.params()


@pytest.mark.parametrize(
    ("cli", "ini", "message"),
    [
        (
            {"count": "maybe"},
            {},
            "command-line option --distperf-count = 'maybe': expected on or off, got 'maybe'",
        ),
        ({}, {"count": "1"}, "ini option distperf_count in t.ini = '1': expected on or off"),
        (
            {"work_tolerance": "1"},
            {},
            "--distperf-work-tolerance = '1': work_tolerance must be in [0, 1), got '1'",
        ),
        ({"work_tolerance": "-0.1"}, {}, "work_tolerance must be in [0, 1), got '-0.1'"),
        ({"work_tolerance": "nan"}, {}, "work_tolerance must be in [0, 1), got 'nan'"),
        (
            {},
            {"work_tolerance": "1%"},
            "ini option distperf_work_tolerance in t.ini = '1%': work_tolerance must be a "
            "number, got '1%'",
        ),
    ],
)
def test_bad_count_and_work_tolerance_name_the_value_and_its_source(
    cli: dict, ini: dict, message: str
) -> None:
    with pytest.raises(SettingError) as info:
        resolve_settings(cli, ini, ini_file="t.ini")
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (1.0, "must be in [0, 1), got 1.0"),
        (True, "must be in [0, 1), got True"),
        ("x", "must be a number, got 'x'"),
    ],
)
def test_bad_work_tolerance_in_the_marker_names_the_test(value: object, problem: str) -> None:
    with pytest.raises(SettingError) as info:
        workload_from_marker({"work_tolerance": value}, "tests/test_x.py::test_y", MODELS)
    assert str(info.value) == (
        f"tests/test_x.py::test_y: distperf(work_tolerance={value!r}): work_tolerance {problem}"
    )


def test_recalibrate_is_a_switch_and_a_bad_ini_value_names_itself() -> None:
    assert resolve_settings({}, {}).recalibrate is False
    assert resolve_settings({"recalibrate": True}, {}).recalibrate is True
    assert resolve_settings({}, {"recalibrate": "yes"}).recalibrate is True
    with pytest.raises(
        SettingError, match=r"distperf_recalibrate.*expected true or false.*'often'"
    ):
        resolve_settings({}, {"recalibrate": "often"}, "tox.ini")
