"""Job mode as a multi-node job runs it: pytest is a rank of a job torchrun or srun started.

Both jobs run on this host: two torchrun agents that rendezvous as two "nodes" (c10d), and two
pytest processes given srun's variables by hand. Every rank runs every test, reaches the same
verdict, and only global rank 0 writes the report and the baselines.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from helpers import free_port

pytestmark = pytest.mark.slow

SUITE = """
import os

import pytest

@pytest.mark.strategy("auto", "fsdp")
@pytest.mark.distperf(model="tiny", max_new_tokens=3, gates=False)
def test_in_job(distperf):
    result = distperf.run()
    assert {r.rank for r in result.ranks} == {0, 1}
    assert result.implementation.backend == "gloo"
"""


def _pytest_args(report: Path) -> list[str]:
    return [
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-rA",
        "--distperf-update-baselines",
        "--distperf-repeats=2",
        f"--distperf-json={report}",
    ]


def _check_written_once(path: Path, report: Path, outputs: list[str]) -> None:
    for output in outputs:  # every rank ran both items and passed them
        assert "2 passed" in output, output
    rows = json.loads(report.read_text())["results"]
    assert [row["strategy"] for row in rows] == ["auto", "fsdp"]
    assert all(row["devices"] == 2 for row in rows)
    [baseline] = (path / "distperf-baselines").glob("*.json")
    assert len(json.loads(baseline.read_text())["entries"]) == 2


def _run_all(commands: list[list[str]], cwd: Path, envs: list[dict[str, str]]) -> list[str]:
    processes = [
        subprocess.Popen(
            command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        for command, env in zip(commands, envs, strict=True)
    ]
    outputs = []
    try:
        for process in processes:
            outputs.append(process.communicate(timeout=300)[0].decode())
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    for process, output in zip(processes, outputs, strict=True):
        assert process.returncode == 0, output
    return outputs


def test_two_torchrun_agents_as_two_nodes(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_job=SUITE)
    report = pytester.path / "report.json"
    endpoint = f"127.0.0.1:{free_port()}"
    run_id = uuid.uuid4().hex[:8]
    commands = [
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=2",
            "--nproc-per-node=1",
            f"--node-rank={node}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}",
            f"--rdzv-id={run_id}",
            "--max-restarts=0",
            *_pytest_args(report),
        ]
        for node in (0, 1)
    ]
    outputs = _run_all(commands, pytester.path, [dict(os.environ)] * 2)
    _check_written_once(pytester.path, report, outputs)
    assert all("test_in_job[auto-2cpu]" in output for output in outputs)


def test_srun_style_environment_without_torchrun(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_job=SUITE)
    report = pytester.path / "report.json"
    port = str(free_port())
    envs = []
    for rank in (0, 1):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE"))}
        env |= {
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(rank),
            "SLURM_NODEID": "0",
            "SLURM_NTASKS": "2",
            "SLURM_NTASKS_PER_NODE": "2",
            "SLURM_JOB_NAME": "distperf-test",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
        }
        envs.append(env)
    commands = [[sys.executable, *_pytest_args(report)]] * 2
    outputs = _run_all(commands, pytester.path, envs)
    _check_written_once(pytester.path, report, outputs)
