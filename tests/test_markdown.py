"""The Markdown summary of a `--distperf-json` report (output/markdown.py): rendering, saved
reports of this repository, malformed input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ci_report import REPORT, ROWS

from pytest_distperf.output.markdown import ReportError, parse_report, render_markdown
from pytest_distperf.output.markdown import main as markdown_main

ROOT = Path(__file__).resolve().parents[1]


def test_render_markdown() -> None:
    text = render_markdown(parse_report(REPORT))
    lines = text.splitlines()
    assert lines[0] == "## distperf results"
    assert lines[2] == (
        "3 results · accelerator cpu · device cpu · topology `cpu_cpu_x2_loopbackx1_2cpus` · "
        "1 FAIL (baseline), 1 ok"
    )
    table = [line for line in lines if line.startswith("|")]
    assert table == [
        "| Test | Strategy | Devices | tok/s | Baseline tok/s | Change | Relative speed "
        "| Rel. change | Verdict |",
        "|---|---|--:|--:|--:|--:|--:|--:|---|",
        "| `examples/test_generate.py::test_generate[fsdp]` | fsdp | 2 | 412.3 | 600.0 | -31.3% "
        "| 0.301 | -2.1% | **FAIL (baseline)** |",
        "| `examples/test_generate.py::test_generate[ddp]` | ddp | 2 | 1,234.5 | 1,230.0 | +0.4% "
        "| – | – | ok |",
        "| `examples/test_tiny.py::test_tiny[a\\|b]` | auto | 1 | 7.25 | – | – | – | – | – |",
    ]
    # only failed or warning checks speak; a multi-line message folds into one list item
    messages = [line for line in lines if line.startswith("- ")]
    assert messages == [
        "- `examples/test_generate.py::test_generate[fsdp]` baseline: throughput regression: "
        "measured median 412 tok/s vs baseline 600 tok/s"
    ]
    assert render_markdown(parse_report(ROWS)) == text  # a bare list of rows works too


def test_render_markdown_of_a_real_report() -> None:
    # The plugin's own JSON report of a gate run on 2 x H200 with the slow-down knob at 10%.
    path = ROOT / "docs" / "benchmarks" / "data" / "gates-v3b" / "slow10.json"
    text = render_markdown(parse_report(json.loads(path.read_text())))
    assert "**FAIL (relative_speed)**" in text
    assert "test_generation_throughput[auto-2cuda]` relative_speed: relative speed regression" in (
        text
    )
    assert "test_generation_throughput[fsdp-2cuda]` baseline: throughput regression" in text


def test_render_markdown_without_results() -> None:
    text = render_markdown(parse_report({"schema": 1, "results": []}), title="t")
    assert text == "## t\n\nNo distperf results: no test ran a measured generation.\n"
    assert render_markdown([], title="t") == text


def test_every_saved_report_parses() -> None:
    """Reports written by earlier versions (statuses said "pass" then) still summarise."""
    paths = sorted((ROOT / "docs" / "benchmarks" / "data").rglob("*.json"))
    reports = [json.loads(p.read_text()) for p in paths]
    reports = [r for r in reports if isinstance(r, dict) and "results" in r]
    assert len(reports) > 10
    for report in reports:
        assert all(row.test_id for row in parse_report(report))


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"results": {}}, "report: field 'results' must be a list, got {}"),
        ({"schema": 2, "results": []}, "report: unknown report schema 2"),
        ("text", "report: expected a JSON object, got str"),
        ([["t"]], r"report: results\[0\]: expected a JSON object, got list"),
        ([{"strategy": "ddp"}], r"results\[0\]: missing field 'test_id'"),
        (
            [{"test_id": "t", "tokens_per_sec": "fast"}],
            r"results\[0\]: field 'tokens_per_sec' must be a number, got 'fast'",
        ),
        ([{"test_id": "t", "devices": True}], "field 'devices' must be an integer, got True"),
        (
            [{"test_id": "t", "baseline_status": "great"}],
            "baseline_status: unknown check status 'great'",
        ),
    ],
)
def test_a_malformed_report_is_refused_with_the_reason(document: object, message: str) -> None:
    with pytest.raises(ReportError, match=message):
        parse_report(document)


def test_markdown_main(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(REPORT))
    assert markdown_main([str(path), "--title", "T"]) == 0
    assert capsys.readouterr().out == render_markdown(parse_report(REPORT), title="T")

    path.write_text("{truncated")
    with pytest.raises(SystemExit) as exit_info:
        markdown_main([str(path)])
    assert exit_info.value.code == 2
    assert f"cannot read report {path}" in capsys.readouterr().err

    path.write_text(json.dumps({"schema": 1, "results": [{"test_id": "t", "change": "-5%"}]}))
    with pytest.raises(SystemExit) as exit_info:
        markdown_main([str(path)])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.endswith(
        f"error: not a distperf JSON report: {path}: results[0]: field 'change' must be a "
        "number, got '-5%'\n"
    )
