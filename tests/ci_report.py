"""Rows of a `--distperf-json` report, for the CI script's and the Markdown renderer's tests."""

from __future__ import annotations

ROWS = [
    {
        "test_id": "examples/test_generate.py::test_generate[fsdp]",
        "strategy": "fsdp",
        "devices": 2,
        "accelerator": "cpu",
        "device_name": "cpu",
        "topology_key": "cpu_cpu_x2_loopbackx1_2cpus",
        "tokens_per_sec": 412.345,
        "baseline_tokens_per_sec": 600.0,
        "change": -0.3128,
        "relative_speed": 0.3012,
        "relative_speed_change": -0.021,
        "verdict": "FAIL (baseline)",
        "baseline_status": "fail",
        "baseline_message": (
            "throughput regression: measured median 412 tok/s\nvs baseline 600 tok/s"
        ),
        "relative_speed_status": "ok",
        "relative_speed_message": "relative speed within tolerance",
    },
    {
        "test_id": "examples/test_generate.py::test_generate[ddp]",
        "strategy": "ddp",
        "devices": 2,
        "accelerator": "cpu",
        "device_name": "cpu",
        "topology_key": "cpu_cpu_x2_loopbackx1_2cpus",
        "tokens_per_sec": 1234.5,
        "baseline_tokens_per_sec": 1230.0,
        "change": 0.0037,
        "verdict": "ok",
        "baseline_status": "ok",
        "baseline_message": "throughput within tolerance",
    },
    {  # no baseline keys at all: a run before any baseline was recorded
        "test_id": "examples/test_tiny.py::test_tiny[a|b]",
        "strategy": "auto",
        "devices": 1,
        "tokens_per_sec": 7.25,
    },
]
REPORT = {"schema": 1, "results": ROWS}
