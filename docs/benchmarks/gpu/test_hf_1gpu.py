"""An HF Llama of about 1B parameters (hf_llama_1b.json, Llama-3.2-1B's shape, random weights
from the seed) through the plugin on one GPU, bf16: `auto`, `fsdp`, `fsdp-noreshard`. Run by
run_hf.sh, eager and with --distperf-compile; hf_generate_baseline.py times the same model's own
`generate` beside it. The workload's sizes come from the environment so that both agree."""

from __future__ import annotations

import os

import pytest

# A config beside this file, as the marker names it (relative to the test's folder).
CONFIG = os.environ.get("DISTPERF_HF_CONFIG", "hf_llama_1b.json")
PROMPT = int(os.environ.get("DISTPERF_HF_PROMPT", "64"))
NEW = int(os.environ.get("DISTPERF_HF_NEW", "64"))


@pytest.mark.strategy("auto", "fsdp", "fsdp-noreshard")
@pytest.mark.distperf(
    model=f"hf:{CONFIG}", precision="bf16", prompt_length=PROMPT, max_new_tokens=NEW
)
def test_hf_llama_1b(distperf):
    result = distperf.run()
    assert result.tokens_per_sec > 0


# Compiled (run_hf.sh runs it in a session of its own): fsdp last, its autotuning the longest.
@pytest.mark.strategy("auto", "fsdp-noreshard", "fsdp")
@pytest.mark.distperf(
    model=f"hf:{CONFIG}", precision="bf16", prompt_length=PROMPT, max_new_tokens=NEW, compile=True
)
def test_hf_llama_1b_compiled(distperf):
    result = distperf.run()
    assert result.tokens_per_sec > 0
