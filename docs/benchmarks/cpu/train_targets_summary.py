"""One line per run of cpu_train_targets.sh: strategy, tok/s, measured/predicted, each check."""

import json
import sys
from pathlib import Path

for report in sorted(Path(sys.argv[1]).glob("*.json")):
    for row in json.loads(report.read_text())["results"]:
        strategy = row["test_id"].split("[")[1].split("-2cpu")[0]
        ratio = row.get("ratio_to_predicted")
        print(
            f"{report.stem:9} {strategy:15} {row['tokens_per_sec']:8.1f} tok/s "
            f"ratio {ratio if ratio is None else round(ratio, 2)!s:5} mfu {row['mfu']:.3f} "
            f"threshold {row['threshold_status']:4} baseline {row.get('baseline_status', '-'):4} "
            f"change {row.get('change') if row.get('change') is None else round(row['change'], 3)} "
            f"loss {row['loss_status']} work {row.get('work_status', '-')}"
        )
