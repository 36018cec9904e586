"""`distperf topology` and `distperf predict`: output, JSON, bad input, and no torch import."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_distperf.cli import main
from pytest_distperf.perfmodel import Calibration, CollectiveFigure

DATA = Path(__file__).parent / "data" / "topologies"
SEED = DATA / "topo_seed_4x_a10g_phb.txt"
H200 = DATA / "topo_2x_h200_nv18.txt"
DGX1 = DATA / "topo_dgx1_v100_8x_nv1_nv2_mlx5_oldlegend.txt"
NVIDIA_SMI_WORDS = r"NV\d+|PIX|PXB|PHB|NODE|SYS"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    code, out, err = _run(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


# --------------------------------------------------------------------------- predict


def test_seed_box_names_the_bounds(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("predict", "--model", "pythia-2.8b", "--devices", "4", "--nvidia-smi-topo", str(SEED))
    code, out, _ = _run(capsys, *args)
    assert code == 0
    rows = {line.split()[0]: line for line in out.splitlines() if line[:1].isalpha()}
    assert "all_gather: all-gather traffic over PHB" in rows["fsdp"]
    assert "weights: weights and KV streaming from memory" in rows["auto"]
    assert "slowest link PHB: nominal all-gather bus bandwidth 12 GB/s" in out
    assert "assumed Gen4 x16" in out  # the parsed output says nothing of PCIe: say what we took
    data = _json(capsys, *args)
    by = {p["strategy"]: p for p in data["predictions"]}
    assert by["fsdp"]["bound"] == "all_gather" and by["fsdp"]["link_class"] == "PHB"
    assert by["auto"]["bound"] == "weights"
    assert set(by) == {"auto", "ddp", "fsdp", "fsdp2", "fsdp-noreshard", "tp", "pipeline"}
    assert all(p["link_class"] == "PHB" for p in data["topology"]["pairs"])
    assert len(data["topology"]["pairs"]) == 6


def test_measured_compute_and_one_strategy(capsys: pytest.CaptureFixture[str]) -> None:
    data = _json(
        capsys,
        "predict",
        "--model",
        "pythia-2.8b",
        "--devices",
        "4",
        "--nvidia-smi-topo",
        str(SEED),
        "--strategy",
        "auto",
        "--compute-ms-per-token",
        "57.8",
    )
    (only,) = data["predictions"]
    assert only["terms"] == {"compute": pytest.approx(0.0578)}
    assert only["tokens_per_sec"] == pytest.approx(1000 / 57.8)


def test_fewer_devices_than_the_topology(capsys: pytest.CaptureFixture[str]) -> None:
    data = _json(
        capsys, "predict", "--model", "tiny", "--devices", "2", "--nvidia-smi-topo", str(DGX1)
    )
    assert data["link_class"] == "NV1"  # GPU0-GPU1 of the DGX-1
    assert data["workload"]["devices"] == 2


def test_calibration_file_is_used(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    figures = (
        CollectiveFigure.from_time("all_gather", 4096, 60e-6, 2),
        CollectiveFigure.from_time("all_gather", 1 << 30, 2.1e-3, 2),
    )
    cal = Calibration(2, "nccl", "cuda", figures, (), 4.2e12, 60e-6)
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"calibration": cal.to_dict()}))
    data = _json(
        capsys,
        "predict",
        "--model",
        "pythia-2.8b",
        "--devices",
        "2",
        "--nvidia-smi-topo",
        str(H200),
        "--calibration",
        str(path),
    )
    assert data["measured_links"] is True
    assert data["link_class"] == "NV18"
    assert data["bus_bandwidth_gbps"] == pytest.approx(cal.all_gather[-1].busbw / 1e9)


def test_predict_on_this_machine_without_files(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(
        capsys, "predict", "--model", "cpu-110m", "--devices", "2", "--accelerator", "cpu"
    )
    assert code == 0, err
    assert "slowest link LOOPBACK" in out


# --------------------------------------------------------------------------- topology


def test_topology_matrix_and_bandwidths(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "topology", "--nvidia-smi-topo", str(H200))
    assert code == 0
    assert ["GPU1", "NV18", "X"] in [line.split() for line in out.splitlines()]
    assert "Nominal all-gather bus bandwidth per pair (GB/s)" in out
    assert "268" in out  # 18 links x 26.5625 GB/s x 0.56


def test_topology_json_has_every_pair_in_nvidia_smi_words(
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = _json(capsys, "topology", "--nvidia-smi-topo", str(DGX1))
    pairs = data["pairs"]
    assert len(pairs) == 8 * 7 // 2
    assert {(p["a"], p["b"]) for p in pairs} == {(a, b) for a in range(8) for b in range(a + 1, 8)}
    assert all(re.fullmatch(NVIDIA_SMI_WORDS, p["link_class"]) for p in pairs)
    assert {p["link_class"] for p in pairs} == {"NV1", "NV2", "SYS"}
    assert data["slowest_link"] == "SYS"
    assert data["topology"]["schema"] == 1


def test_topology_json_round_trips_through_topology_option(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    saved = _json(capsys, "topology", "--nvidia-smi-topo", str(SEED))["topology"]
    path = tmp_path / "topo.json"
    path.write_text(json.dumps(saved))
    again = _json(capsys, "topology", "--topology", str(path), "--devices", "2")
    assert again["devices"] == 2
    assert [p["link_class"] for p in again["pairs"]] == ["PHB"]


def test_topology_of_cpu_ranks(capsys: pytest.CaptureFixture[str]) -> None:
    data = _json(capsys, "topology", "--accelerator", "cpu", "--devices", "3")
    assert data["accelerator"] == "cpu"
    assert [p["link_class"] for p in data["pairs"]] == ["LOOPBACK"] * 3


def test_topology_of_cuda_without_devices_is_every_gpu_nvml_sees(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An explicit `--accelerator cuda` asks NVML, not torch's build, how many GPUs there are."""
    from pytest_distperf import topology
    from pytest_distperf.topology import gpus

    two = topology.load_nvidia_smi_topo(str(H200), None)
    asked: list[object] = []
    monkeypatch.setattr(topology, "probe_nvml", lambda indices: asked.append(indices) or two)
    monkeypatch.setattr(gpus, "visible_gpus", lambda: pytest.fail("torch's count was asked"))
    data = _json(capsys, "topology", "--accelerator", "cuda")
    assert asked == [None]
    assert data["devices"] == 2


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["predict", "--model", "gpt-5", "--devices", "2", "--nvidia-smi-topo", str(SEED)],
            "--model: unknown model config 'gpt-5'; valid names:",
        ),
        (
            ["predict", "--model", "tiny", "--devices", "8", "--nvidia-smi-topo", str(SEED)],
            f"--nvidia-smi-topo: topology file {SEED} describes 4 devices but the run uses 8",
        ),
        (
            ["predict", "--model", "tiny", "--devices", "2", "--nvidia-smi-topo", "/no/such"],
            "--nvidia-smi-topo: topology file /no/such does not exist",
        ),
        (
            ["topology", "--topology", "/no/such.json"],
            "--topology: topology file /no/such.json does not exist",
        ),
        (
            ["topology", "--topology", str(SEED)],
            f"--topology: topology file {SEED} is not JSON",
        ),
        (
            ["topology", "--nvidia-smi-topo", str(DATA / "rocm_smi_showtopo_4x_mi210_xgmi.txt")],
            "is not `nvidia-smi topo -m` output",
        ),
        (
            ["predict", "--model", "tiny", "--devices", "2", "--calibration", "/no/cal.json"],
            "--calibration: file /no/cal.json does not exist",
        ),
        (
            [
                "predict",
                "--model",
                "tiny",
                "--devices",
                "2",
                "--accelerator",
                "cpu",
                "--prompt-length",
                "200",
                "--max-new-tokens",
                "100",
            ],
            "exceeds tiny's block_size 256",
        ),
    ],
)
def test_bad_input_exits_2_with_the_reason(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = _run(capsys, *argv)
    assert code == 2
    assert message in err
    assert "Traceback" not in err and out == ""


def test_calibration_for_another_device_count(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    figures = (CollectiveFigure.from_time("all_gather", 4096, 1e-4, 4),)
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(Calibration(4, "gloo", "cpu", figures, (), 1e10, 1e-4).to_dict()))
    argv = ["predict", "--model", "tiny", "--devices", "2", "--accelerator", "cpu"]
    code, _, err = _run(capsys, *argv, "--calibration", str(path))
    assert code == 2
    assert f"file {path} was measured on 4 ranks but --devices is 2" in err
    path.write_text('{"world_size": 2}')
    code, _, err = _run(capsys, *argv, "--calibration", str(path))
    assert code == 2 and "has the wrong shape: calibration: missing field" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["predict", "--model", "tiny", "--devices", "0"], "expected a positive integer, got 0"),
        (["predict", "--model", "tiny", "--devices", "2", "--strategy", "zero3"], "invalid choice"),
        (
            ["predict", "--model", "tiny", "--devices", "2", "--compute-ms-per-token", "-1"],
            "expected a positive number",
        ),
        (
            ["topology", "--nvidia-smi-topo", str(SEED), "--topology", "x.json"],
            "not allowed with argument",
        ),
        (["predict", "--devices", "2"], "the following arguments are required: --model"),
    ],
)
def test_malformed_options_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


# --------------------------------------------------------------------------- as a command


def test_commands_never_import_torch() -> None:
    """Nor LitGPT's package: a LitGPT name is counted from its config file alone."""
    litgpt = "litgpt:pythia-14m" if importlib.util.find_spec("litgpt") else "pythia-14m"
    code = (
        "import sys, io, contextlib\n"
        "from pytest_distperf.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    for model in ('llama-2-7b', {litgpt!r}):\n"
        "        main(['predict', '--model', model, '--devices', '4',\n"
        f"              '--nvidia-smi-topo', {str(SEED)!r}])\n"
        "    main(['topology', '--accelerator', 'cpu'])\n"
        "loaded = ('torch', 'lightning', 'pytest', 'litgpt')\n"
        "print(sorted(m for m in loaded if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"


# The installed environment's own script first: CI runs this environment's python without its
# bin folder on PATH.
BESIDE = Path(sys.executable).parent / "distperf"
CONSOLE_SCRIPT = str(BESIDE) if BESIDE.exists() else shutil.which("distperf")


@pytest.mark.skipif(CONSOLE_SCRIPT is None, reason="console script not installed")
def test_console_script() -> None:
    done = subprocess.run(
        [CONSOLE_SCRIPT, "predict", "--model", "nope", "--devices", "2", "--accelerator", "cpu"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "distperf predict: error: --model: unknown model config 'nope'" in done.stderr
