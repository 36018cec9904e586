"""The GPU benchmark scripts refuse bad settings before they install or run anything."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

GATE = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "gpu" / "run_gate.sh"


def _gate(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "STATE": str(tmp_path / "state"), "OUT": str(tmp_path / "out"), **env}
    return subprocess.run(
        ["bash", str(GATE)], cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("extra", ["0", "1.5", "lots"])
def test_gate_script_names_a_bad_extra(tmp_path: Path, extra: str) -> None:
    done = _gate(tmp_path, EXTRA=extra)
    assert done.returncode == 2
    assert f"EXTRA={extra}: a fraction in (0, 1) of each block's bytes" in done.stderr


def test_gate_script_names_a_seed_without_records_and_copies_nothing(tmp_path: Path) -> None:
    seed = tmp_path / "seed"
    (seed / "baselines").mkdir(parents=True)  # baselines but no record-*.json
    done = _gate(tmp_path, SEED=str(seed))
    assert done.returncode == 2
    assert f"SEED={seed}: no baselines/ and record-*.json to start from" in done.stderr
    assert not (tmp_path / "state" / "baselines").exists()
