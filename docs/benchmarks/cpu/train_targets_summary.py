"""One line per run of cpu_train_targets.sh: strategy, tok/s, measured/predicted, each check, the
peak memory; then per strategy the recorded run's steps and the tolerance they give a baseline."""

import json
import re
import sys
from pathlib import Path


def strategy_of(row):
    return row["test_id"].split("[")[1].split("-2cpu")[0]


for report in sorted(Path(sys.argv[1]).glob("*.json")):
    for row in json.loads(report.read_text())["results"]:
        ratio = row.get("ratio_to_predicted")
        print(
            f"{report.stem:9} {strategy_of(row):15} {row['tokens_per_sec']:8.1f} tok/s "
            f"ratio {ratio if ratio is None else round(ratio, 2)!s:5} mfu {row['mfu']:.3f} "
            f"threshold {row['threshold_status']:4} baseline {row.get('baseline_status', '-'):4} "
            f"change {row.get('change') if row.get('change') is None else round(row['change'], 3)} "
            f"loss {row['loss_status']} work {row.get('work_status', '-')} "
            f"memory {row['peak_memory_bytes'] >> 20} MiB {row.get('memory_status') or '-'}"
        )

record = Path(sys.argv[1]) / "record.json"
if record.exists():
    print("\nrecorded run: steps (min / median / max ms), the baseline's tolerance")
    for row in json.loads(record.read_text())["results"]:
        tokens = row["tokens_per_sec"] * row["step_time_s"]  # per step, every replica
        steps = sorted(tokens / rate * 1e3 for rate in row["tokens_per_sec_samples"])
        caught = re.search(r"drops of ([\d.]+)%", row.get("baseline_message") or "")
        print(
            f"{strategy_of(row):15} {steps[0]:.0f} / {steps[len(steps) // 2]:.0f} / "
            f"{steps[-1]:.0f}  tolerance {caught.group(1) + '%' if caught else '-'}"
        )
