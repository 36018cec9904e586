"""Job mode as a multi-node job runs it: pytest is a rank of a job torchrun or srun started.

Both jobs run on this host: two torchrun agents that rendezvous as two "nodes" (c10d), and two
pytest processes given srun's variables by hand. Every rank runs every test, reaches the same
verdict, and only global rank 0 writes the report and the baselines. A test that raises in one
rank alone fails in every rank at once and the next test runs; one that hangs ends the job at
its timeout, with rank 0's summary.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from helpers import BUILDERS, free_port

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


def _check_written_once(path: Path, report: Path, outputs: list[str], nodes: int) -> None:
    for output in outputs:  # every rank ran both items and passed them
        assert "2 passed" in output, output
    rows = json.loads(report.read_text())["results"]
    assert [row["strategy"] for row in rows] == ["auto", "fsdp"]
    assert all(row["devices"] == 2 and row["nodes"] == nodes for row in rows)
    # A job over two nodes is never held to one node's baselines, nor one node to its.
    [key] = {row["topology_key"] for row in rows}
    assert key.endswith("_2nodes") if nodes == 2 else not key.endswith("nodes"), key
    [baseline] = (path / "distperf-baselines").glob("*.json")
    assert baseline.stem == key
    assert len(json.loads(baseline.read_text())["entries"]) == 2


def _run_all(
    commands: list[list[str]], cwd: Path, envs: list[dict[str, str]], returncode: int = 0
) -> list[str]:
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
        assert process.returncode == returncode, output
    return outputs


def _two_agents(args: list[str], path: Path) -> list[list[str]]:
    """Two torchrun agents on this host that rendezvous as two nodes of one rank each, their
    logs under `path` (torchrun's default, a new directory in /tmp per agent, outlives it)."""
    endpoint = f"127.0.0.1:{free_port()}"
    run_id = uuid.uuid4().hex[:8]
    return [
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
            f"--log-dir={path / 'torchrun-logs'}",
            *args,
        ]
        for node in (0, 1)
    ]


def test_two_torchrun_agents_as_two_nodes(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_job=SUITE)
    report = pytester.path / "report.json"
    commands = _two_agents(_pytest_args(report), pytester.path)
    outputs = _run_all(commands, pytester.path, [dict(os.environ)] * 2)
    _check_written_once(pytester.path, report, outputs, nodes=2)
    assert all("test_in_job[auto-2cpu]" in output for output in outputs)
    _check_network(pytester.path, report, outputs)


def _check_network(path: Path, report: Path, outputs: list[str]) -> None:
    """One rank per node: every collective crossed the network, which the calibration measured,
    the topology names (each node's own links: none) and the prediction charges."""
    rows = json.loads(report.read_text())["results"]
    calibration = rows[0]["calibration"]
    assert (calibration["nodes"], calibration["scope"], calibration["within_node"]) == (
        2,
        "network",
        None,
    )
    assert calibration["world_size"] == 2 and calibration["all_gather"]
    fsdp = rows[1]["prediction"]
    assert fsdp["link_class"] == "network between 2 nodes"
    network = fsdp["network"]
    assert network["nodes"] == 2 and network["measured"] and network["busbw"] > 0
    # CPU ranks replay fsdp's all-gathers in the ranks (across the network, measured as they
    # run: perfmodel.md, "Measured in the ranks"); the calibrated latency is the network's
    assert "latency" in network["terms"] and network["seconds"] > 0
    assert rows[0]["prediction"]["network"]["terms"] == {}  # auto: no collective per token
    [baseline] = (path / "distperf-baselines").glob("*.json")
    topology = json.loads(baseline.read_text())["topology"]
    assert len(topology["devices"]) == 1 and topology["network"]["busbw"] > 0
    for output in outputs:
        # before the first run, then in the summary once the calibration measured it
        assert "per node no links (one device); network between 2 nodes: unknown" in output
        assert "network between 2 nodes: measured " in output, output
        assert "(gloo all-gather over 2 ranks, 1 per node)" in output


FAILING = """
import pytest

@pytest.mark.distperf(model="builders:raising", max_new_tokens=3, gates=False)
def test_raises_in_rank_1(distperf):
    distperf.run()

@pytest.mark.distperf(model="tiny", max_new_tokens=3, gates=False)
def test_after_it(distperf):
    distperf.run()
"""


def test_a_rank_that_raises_alone_fails_the_test_in_every_rank(pytester: pytest.Pytester) -> None:
    # Rank 0 waits in a collective for rank 1, which raised building its model: rank 0 must not
    # wait for the timeout, and the job's group must work again for the next test.
    pytester.makepyfile(builders=BUILDERS, test_job=FAILING)
    args = ["-m", "pytest", "-p", "no:cacheprovider", "-rA", "--distperf-repeats=2"]
    start = time.monotonic()
    commands = _two_agents([*args, "--distperf-timeout=120"], pytester.path)
    outputs = _run_all(commands, pytester.path, [dict(os.environ)] * 2, returncode=1)
    elapsed = time.monotonic() - start
    for output in outputs:
        assert "1 failed, 1 passed" in output, output
        assert "FAILED test_job.py::test_raises_in_rank_1[auto-2cpu]" in output, output
        assert "distperf: rank 1 of 2 failed after" in output, output
        assert "ValueError: boom on rank 1" in output, output
        assert "PASSED test_job.py::test_after_it[auto-2cpu]" in output, output
    # Start-up, two tests and the exit, nowhere near the timeout the failure used to wait for.
    assert elapsed < 60, elapsed


HANGING = """
import pytest

@pytest.mark.distperf(model="tiny", max_new_tokens=3, gates=False)
def test_before_it(distperf):
    distperf.run()

@pytest.mark.distperf(model="builders:hanging", max_new_tokens=3, gates=False)
def test_hangs_in_rank_1(distperf):
    distperf.run()

@pytest.mark.distperf(model="tiny", max_new_tokens=3, gates=False)
def test_never_run(distperf):
    distperf.run()
"""


def test_a_hung_rank_stops_the_job_and_rank_0_says_so(pytester: pytest.Pytester) -> None:
    # One torchrun agent with both ranks: it stops the other rank as soon as one exits, so
    # the ranks must leave together for rank 0 to report.
    pytester.makepyfile(builders=BUILDERS, test_job=HANGING)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node=2", "--max-restarts=0", "--tee=3"]
    command += [f"--log-dir={pytester.path / 'torchrun-logs'}", "-m", "pytest"]
    command += ["-p", "no:cacheprovider", "-rA", "--distperf-repeats=2", "--distperf-timeout=7"]
    [output] = _run_all([command], pytester.path, [dict(os.environ)], returncode=1)
    for rank in ("0", "1"):
        lines = [line for line in output.splitlines() if line.startswith(f"[default{rank}]:")]
        text = "\n".join(line.split(":", 1)[1] for line in lines)
        assert "1 failed, 1 passed" in text, output
        assert "test_never_run" not in text.split("short test summary info")[-1], text
        assert "distperf: still running after --distperf-timeout=7 s" in text, text
        assert "distperf: the job stops: test_job.py::test_hangs_in_rank_1[auto-2cpu] ran " in text
        # where rank 1 was: in the builder's sleep, named in every rank's failure
        assert 'builders.py", line' in text and "in hanging" in text, text


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
    _check_written_once(pytester.path, report, outputs, nodes=1)
