"""What a test asks the ranks to run: the workload and the run's spec (measured.py holds what
they measured). Plain frozen dataclasses (picklable, no torch)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from pytest_distperf.platform import Platform, platform_of

# Bytes per stored parameter; "bf16-mixed" (training only) keeps float32 weights under autocast.
PRECISION_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "bf16-mixed": 4}
PRECISIONS = tuple(PRECISION_BYTES)
# Bytes per element FSDP moves in a training step (bf16-mixed: in bfloat16, Fabric's plugin).
COMM_BYTES = {**PRECISION_BYTES, "bf16-mixed": 2}
MODES = ("generate", "train")
TRAIN_ONLY_PRECISIONS = ("bf16-mixed",)
DEFAULT_SEQ_LENGTH = 128  # tokens per training sequence when the marker names none
# `distperf(model="litgpt:pythia-14m")`: LitGPT's own GPT for that config name (the litgpt extra).
LITGPT_PREFIX = "litgpt:"
LITGPT_EXTRA = "pip install 'pytest-distperf[litgpt]'"
# `distperf(model="hf:configs/llama")`: a `transformers` causal LM from its config (the hf extra).
HF_PREFIX = "hf:"
HF_EXTRA = "pip install 'pytest-distperf[hf]'"


@dataclass(frozen=True)
class Workload:
    """What one test generates; set by the `distperf` marker. `model`: a preset, "litgpt:<name>",
    "hf:<config>" or a builder "package.module:function" (`function(seed=, device=, dtype=)`,
    the contract: docs/extending.md); `generate`: the user's loop `function(model, prompt,
    max_new_tokens)`; `shard_unit`: the class FSDP wraps; `tp_plan`: `function(model, tp_mesh)
    -> model`."""

    model: str = "tiny"
    max_new_tokens: int = 32
    prompt_length: int = 8
    batch_size: int = 1
    precision: str = "fp32"
    seed: int = 1234
    # Fraction by which to slow every timed generation, proving verdicts can fail (docs/gates.md).
    slowdown: float = 0.0
    generate: str | None = None
    shard_unit: str | None = None
    tp_plan: str | None = None
    # Seconds added to every all-reduce (tp) and send (pipeline): a communication-only slow-down.
    comm_delay: float = 0.0
    compile: bool | None = None  # compile the decode step; None: --distperf-compile decides
    # "train": optimizer steps on batch_size x seq_length tokens per rank (docs/training.md).
    mode: str = "generate"
    seq_length: int | None = None  # train mode's tokens per sequence; None in generate mode

    @property
    def training(self) -> bool:
        return self.mode == "train"

    @property
    def model_source(self) -> str:
        """Where the model comes from: "preset", "litgpt", "hf" or "builder" (a user's function)."""
        if self.model.startswith(LITGPT_PREFIX):
            return "litgpt"
        if self.model.startswith(HF_PREFIX):
            return "hf"
        return "builder" if ":" in self.model else "preset"

    @property
    def is_custom_builder(self) -> bool:
        """A builder's or `transformers` model's shape is measured once a rank builds it."""
        return self.model_source in ("builder", "hf")

    def params(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class RunSpec:
    """Everything a rank needs to know; built in the pytest process, pickled to every rank."""

    test_id: str
    strategy: str
    devices: int
    accelerator: str  # resolved: "cpu" or "cuda"
    workload: Workload
    repeats: int
    warmup: int
    timeout: float
    threads_per_rank: int = 1
    nodes: int = 1  # > 1 only inside a multi-node job launched by torchrun/SLURM
    # Decode steps of the unwrapped model timed before wrapping (ranks/reference.py); 0: none.
    reference_steps: int = 8
    calibration_sizes: Any = None  # perfmodel.MessageSizes to calibrate in this run, or None
    numa_binding: str | None = None  # torch.numa.binding.AffinityMode value; None: no binding
    compile: bool = False  # compile the decode step (ranks/compiled.py)
    sys_path: tuple[str, ...] = ()  # the pytest process's: what a test imports, its ranks can
    calibrate_model: bool = False
    count_work: bool = True  # one more generation, its work counted (ranks/counting.py)
    # The bare model beside every repeat of a replicated strategy too (--distperf-relative-speed).
    relative_speed: bool = False
    test_dir: str = ""  # the test file's folder: a relative `hf:<config>` starts there

    @property
    def platform(self) -> Platform:
        return platform_of(self.accelerator)

    @property
    def model_source(self) -> str:
        return self.workload.model_source
