"""Judges one RunResult for the session: its prediction on this topology, its baseline, the
decision, the new baseline entry (--distperf-update-baselines) and the JudgedRun record."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from pytest_distperf.judge.busy import busy_evidence
from pytest_distperf.judge.checks import Decision, GateSettings, memory_check, skipped_check
from pytest_distperf.judge.counted import device_time_check, work_check
from pytest_distperf.judge.record import JudgedRun
from pytest_distperf.judge.threshold import threshold_check
from pytest_distperf.judge.throughput import baseline_check, detectable_check, relative_speed_check
from pytest_distperf.judge.training import loss_check
from pytest_distperf.measured import RunResult
from pytest_distperf.perfmodel import (
    DEFAULT_OVERHEADS,
    Calibration,
    MessageSizes,
    Overheads,
    Prediction,
    measured_network,
    run_links,
)
from pytest_distperf.spec import COMM_BYTES, PRECISION_BYTES, Workload
from pytest_distperf.store.entry import BaselineEntry
from pytest_distperf.store.identity import repository_nodeid
from pytest_distperf.store.store import BaselineStore
from pytest_distperf.strategies import message_sizes_for, predict_for, predict_train_for
from pytest_distperf.topology import Topology

BASELINE_DIR_NAME = "distperf-baselines"


def test_identity(result: RunResult, nodeid: str | None = None) -> str:
    """What makes two runs comparable: node id (default pytest's) and workload, less the
    slow-down knobs (a slowed run meets its normal baseline) and arguments left unset."""
    knobs = ("slowdown", "comm_delay", "compile")
    params = {
        k: v for k, v in result.spec.workload.params().items() if k not in knobs and v is not None
    }
    if not result.spec.workload.training:  # generations' identities predate the mode
        params.pop("mode", None)
    if result.spec.compile:  # from the marker or --distperf-compile: never an eager baseline
        params["compile"] = True
    described = " ".join(f"{k}={params[k]}" for k in sorted(params))
    return f"{nodeid or result.spec.test_id} [{described}]"


@dataclass
class Gate:
    topology: Topology
    store: BaselineStore
    update: bool = False
    writes: bool = True  # False on ranks other than 0 of a launched job
    commit: str | None = None
    rootpath: Path | None = None  # pytest's rootdir; None: identities are the node ids
    # identity -> (the older rootdir-relative form, found or not), of each run looked up
    looked_up: dict[str, tuple[str, bool]] = field(default_factory=dict, repr=False)

    @property
    def topology_key(self) -> str:
        """The topology's key and NCCL settings that change the transport (transport_suffix)."""
        return self.topology.key() + transport_suffix(self.topology.accelerator)

    def prediction(
        self, result: RunResult, calibration: Calibration | None
    ) -> tuple[Prediction | None, str]:
        """The predicted rate, or None with the reason there is none."""
        from pytest_distperf.models import run_shape

        workload = result.spec.workload
        shape = run_shape(result)
        if shape is None:
            return None, f"model {workload.model!r}: the ranks did not report its shape"
        suffix = transport_suffix(self.topology.accelerator)
        links = run_links(self.topology, result.devices, calibration, suffix)
        run = (shape, result.strategy, result.devices, links)
        common = {
            "device_type": result.spec.accelerator,
            "batch_size": workload.batch_size,
            "overheads": run_overheads(result),
            "counted_collectives": counted_collectives(result),
        }
        if result.training:
            rates = [r.matmul_flops_per_s for r in result.ranks if r.matmul_flops_per_s]
            step = predict_train_for(
                *run,
                seq_length=workload.seq_length or 0,
                param_bytes=PRECISION_BYTES[workload.precision],
                comm_bytes=COMM_BYTES[workload.precision],
                step_compute_s=result.reference_step_s,
                matmul_flops_per_s=min(rates, default=None),  # the slowest rank's
                **common,
            )
            return step, ""
        prediction = predict_for(
            *run,
            prompt_length=workload.prompt_length,
            max_new_tokens=workload.max_new_tokens,
            dtype_bytes=PRECISION_BYTES[workload.precision],
            compute_time_s=result.reference_token_s,
            prefill_time_s=result.reference_prefill_s,
            collective_in_step_s=result.in_step_collective_s,
            **common,
        )
        if result.eager_reference:
            note = (
                "compute: the eager model's step, timed before wrapping (no compiled whole copy "
                "ran beside this compiled run: it did not fit); a compiled reference would be "
                "faster, so this threshold is looser than it should be"
            )
            prediction = replace(prediction, assumptions=(note, *prediction.assumptions))
        return prediction, ""

    def judge(
        self,
        result: RunResult,
        settings: GateSettings,
        calibration: Calibration | None,
        *,
        session_started_at: float,
    ) -> JudgedRun:
        """Apply every check to `result` and store it as the baseline when asked."""
        if calibration is not None:  # a job over several nodes: its network, once measured
            self.topology = measured_network(self.topology, calibration)
        prediction, why_none = self.prediction(result, calibration)
        decision = self.decide(result, settings, prediction, why_none)
        return JudgedRun.of(
            result,
            decision,
            prediction=prediction,
            topology_key=self.topology_key,
            baseline_recorded=self.record(result, decision),
            calibration=calibration,
            session_started_at=session_started_at,
        )

    def decide(
        self,
        result: RunResult,
        settings: GateSettings,
        prediction: Prediction | None,
        why_none: str = "",
    ) -> Decision:
        """Every check on its own: none reads or changes another's outcome."""
        spec = result.spec
        threshold = threshold_check(
            prediction,
            result.tokens_per_sec,
            settings.efficiency,
            devices=result.devices,
            accelerator=spec.accelerator,
            strategy=result.strategy,
            mode=spec.workload.mode,
            why_none=why_none,
        )
        loss = {"loss": loss_check(result)} if result.training else {}
        if self.update:
            why = "not compared: this run records the baseline (--distperf-update-baselines)"
            compared = ("relative_speed", "memory", "work", "device_time")
            return Decision(
                threshold=threshold,
                gates=settings.gates,
                baseline=detectable_check(result.tokens_per_sec_samples, settings),
                **{name: skipped_check(name, why) for name in compared},
                **loss,  # a baseline must train the right function too
            )
        entry = self.baseline_entry(result)
        exact_memory = spec.accelerator == "cuda"  # allocator peak, not process RSS
        return Decision(
            threshold=threshold,
            gates=settings.gates,
            baseline=baseline_check(entry, result, settings, self.topology_key, self.store.keys()),
            relative_speed=relative_speed_check(entry, result, settings),
            memory=memory_check(entry, result.peak_memory_bytes, exact_memory),
            work=work_check(entry, result.work, settings, counted=spec.count_work),
            device_time=device_time_check(entry, result.device_time_per_token_s, settings),
            **loss,
            busy_evidence=None if entry is None else busy_evidence(entry, result),
        )

    def identities(self, result: RunResult) -> tuple[str, str]:
        """This run's identity (from the repository root) and the rootdir-relative form."""
        legacy = test_identity(result)
        if self.rootpath is None:
            return legacy, legacy
        return test_identity(result, repository_nodeid(result.spec.test_id, self.rootpath)), legacy

    def baseline_entry(self, result: RunResult) -> BaselineEntry | None:
        """The entry under this run's identity, else under its older form (noted for orphans)."""
        identity, legacy = self.identities(result)
        entry = self.store.find(self.topology_key, identity, legacy)
        self.looked_up[identity] = (legacy, entry is not None)
        return entry

    def record(self, result: RunResult, decision: Decision) -> bool:
        """Store this run as the baseline unless a check failed: it must not be the yardstick."""
        if not (self.update and self.writes) or decision.failed:
            return False
        judged = getattr(decision.threshold.figures, "predicted_tokens_per_sec", None)
        identity, legacy = self.identities(result)
        entry = BaselineEntry.from_samples(
            identity,
            result.tokens_per_sec_samples,
            peak_memory_bytes=result.peak_memory_bytes,
            versions=result.versions,
            commit=self.commit,
            extra={"predicted_tokens_per_sec": judged} if judged else None,
            relative_samples=result.relative_speed_samples,
            host_loop_samples=result.host_loop_samples,
            work=result.work,
            host_cpu_per_token_s=result.host_cpu_per_token_s,
            device_time_per_token_s=result.device_time_per_token_s,
            waits={
                "run_queue_wait_run_medians": result.run_queue_wait_per_token_s,
                "steal_run_medians": result.steal_per_token_s,
                "off_cpu_share_run_medians": result.off_cpu_share,
            },
        )
        self.store.save(
            self.topology_key,
            {entry.test_id: entry},
            self.topology.to_dict(),
            moved_from={identity: legacy},  # an entry stored under the older form moves here
        )
        return True


TRANSPORT_VARIABLES = ("NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_SHM_DISABLE", "NCCL_NET")


def counted_collectives(result: RunResult) -> dict[str, tuple[float, float]] | None:
    """kind -> (calls, bytes) per decode token (or step) as counted; None: not counted."""
    if result.work is None:
        return None
    return {k: (c.calls, c.bytes) for k, c in result.work.main.collectives.items()}


def run_overheads(result: RunResult) -> Overheads:
    """A run compiled around its wrapper's hooks pays more per unit than an eager one."""
    return DEFAULT_OVERHEADS.around_graph_breaks() if result.graph_breaks else DEFAULT_OVERHEADS


def transport_suffix(accelerator: str) -> str:
    """E.g. "_nccl-p2p-disable-1" when NCCL_P2P_DISABLE=1 is set for a CUDA run."""
    if accelerator != "cuda":
        return ""
    values = {name: os.environ.get(name, "").strip().lower() for name in TRANSPORT_VARIABLES}
    parts = [f"{name.lower().replace('_', '-')}-{value}" for name, value in values.items() if value]
    return "".join(f"_{re.sub(r'[^a-z0-9.-]', '-', part)}" for part in parts)


def default_baseline_dir(rootpath: Path) -> Path:
    return rootpath / BASELINE_DIR_NAME


def session_message_sizes(
    workloads: list[tuple[str, Workload]], devices: int, max_bytes: int | None = None
) -> MessageSizes | None:
    """Union of the message sizes every collected (strategy, workload) uses, up to `max_bytes`;
    a builder's model is calibrated in its ranks once built (RunSpec.calibrate_model)."""
    from pytest_distperf.models import shape_of

    used = []
    for strategy, workload in workloads:
        shape = None if workload.training else shape_of(workload.model)
        if shape is not None:  # a builder's or a training step's: calibrated in the ranks
            precision = PRECISION_BYTES[workload.precision]
            used.append(message_sizes_for(shape, strategy, devices, precision, workload.batch_size))

    def union(kind: str) -> tuple[int, ...]:
        return tuple(sorted({size for sizes in used for size in getattr(sizes, kind)}))

    if not union("all_gather"):
        return None
    return MessageSizes(union("all_gather"), union("all_reduce"), union("p2p")).up_to(max_bytes)
