"""Plugin behaviour end to end through pytester: options, markers, collection, skips."""

from __future__ import annotations

import subprocess
import sys

import pytest

TEST_TWO_STRATEGIES = """
import pytest

@pytest.mark.strategy("auto", "fsdp")
@pytest.mark.distperf(model="tiny", max_new_tokens=4)
def test_throughput(distperf):
    pass
"""


def test_importing_the_plugin_does_not_import_torch() -> None:
    code = "import sys, pytest_distperf.plugin; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_help_lists_every_option_with_ini_twin(pytester: pytest.Pytester) -> None:
    from pytest_distperf.options import OPTIONS

    result = pytester.runpytest("--help")
    for spec in OPTIONS:
        result.stdout.fnmatch_lines([f"*{spec.flag}*", f"*{spec.ini} *"])


def test_markers_are_registered(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.strategy(*names)*", "@pytest.mark.distperf(model=*"])


def test_one_item_per_strategy_with_devices_in_id(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(TEST_TWO_STRATEGIES)
    result = pytester.runpytest(
        "--collect-only", "-q", "--distperf-devices", "3", "--distperf-accelerator", "cpu"
    )
    result.stdout.fnmatch_lines(
        ["*test_throughput[[]auto-3cpu[]]", "*test_throughput[[]fsdp-3cpu[]]"]
    )
    assert result.ret == 0


def test_ini_sets_devices(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(TEST_TWO_STRATEGIES)
    pytester.makeini("[pytest]\ndistperf_devices = 5\ndistperf_accelerator = cpu\n")
    result = pytester.runpytest("--collect-only", "-q")
    result.stdout.fnmatch_lines(["*[[]auto-5cpu[]]"])


@pytest.mark.parametrize("bad", ["0", "-3", "abc"])
def test_bad_device_count_is_a_usage_error(pytester: pytest.Pytester, bad: str) -> None:
    pytester.makepyfile(TEST_TWO_STRATEGIES)
    result = pytester.runpytest(f"--distperf-devices={bad}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"*pytest-distperf: command-line option --distperf-devices*{bad}*"]
    )


def test_bad_ini_value_names_the_ini_file(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ndistperf_repeats = many\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*distperf_repeats in *tox.ini* expected an integer, got 'many'*"])


def test_unknown_strategy_fails_its_test_naming_test_and_choices(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.strategy("auto", "zero3")
        def test_x(distperf):
            pass
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at setup of test_x[[]invalid-marker[]]*",
            "*test_unknown_strategy_fails_its_test_naming_test_and_choices.py::test_x: "
            "unknown strategy 'zero3'*valid: auto, ddp, fsdp, fsdp2, fsdp-noreshard*",
        ]
    )


@pytest.mark.parametrize(
    ("marker", "expected"),
    [
        (
            'model="gpt-9"',
            "*test_x: distperf(model='gpt-9') is not a known model; valid: pythia-14m*",
        ),
        ("max_new_tokens=-1", "*test_x: distperf(max_new_tokens=-1) must be a positive integer*"),
        ('precision="int8"', "*test_x: distperf(precision='int8') is not one of fp32, bf16, fp16*"),
        ("temperature=1", "*test_x: unknown distperf marker argument(s) temperature*"),
        ('"tiny"', "*test_x: distperf marker takes keyword arguments only*"),
    ],
)
def test_bad_distperf_marker_fails_its_test(
    pytester: pytest.Pytester, marker: str, expected: str
) -> None:
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.distperf({marker})
        def test_x(distperf):
            pass
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([expected])


@pytest.mark.parametrize(
    ("marker", "expected"),
    [
        ('strategy("zero3")', "*test_bad: unknown strategy 'zero3'*"),
        ("devices(0)", "*test_bad: @pytest.mark.devices takes positive integers*got 0*"),
        ('distperf(precision="int8")', "*test_bad: distperf(precision='int8') is not one of*"),
    ],
)
def test_a_bad_marker_leaves_the_other_tests_of_its_module_alone(
    pytester: pytest.Pytester, marker: str, expected: str
) -> None:
    """One typo used to be a collection error that stopped the whole file, even under -k."""
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.{marker}
        def test_bad(distperf):
            pass

        @pytest.mark.strategy("auto", "fsdp")
        def test_good(distperf):
            pass
        """
    )
    result = pytester.runpytest("--distperf-accelerator=cpu", "-rE")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*ERROR at setup of test_bad[[]invalid-marker[]]*", expected])
    selected = pytester.runpytest("--distperf-accelerator=cpu", "-k", "test_good")
    selected.assert_outcomes(passed=2, deselected=1)


def test_more_cuda_devices_than_visible_skips_naming_both(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(TEST_TWO_STRATEGIES)
    visible = _visible_gpus()
    wanted = visible + 2
    result = pytester.runpytest(
        "-rs", "--distperf-accelerator", "cuda", "--distperf-devices", str(wanted)
    )
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(
        [f"*{wanted} CUDA devices requested (--distperf-devices) but {visible} visible*"]
    )


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def test_bad_ini_switch_names_the_ini_option(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ndistperf_strict = maybe\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*distperf_strict in *tox.ini* expected true or false*maybe*"])


def test_workload_longer_than_the_model_context_fails_its_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.distperf(model="tiny", prompt_length=200, max_new_tokens=100)
        def test_x(distperf):
            pass
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*test_x: *needs 300 positions but model 'tiny' has block_size=256*"]
    )


def test_report_path_that_cannot_be_written_is_a_usage_error(pytester: pytest.Pytester) -> None:
    blocker = pytester.path / "a-file"
    blocker.write_text("")
    result = pytester.runpytest(f"--distperf-json={blocker}/report.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--distperf-json *a-file/report.json: cannot create its directory*"]
    )
