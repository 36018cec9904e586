"""The plugin's tok/s over the model's own `generate` (eager with eager, compiled with compiled)
from run_hf.sh's JSON files: summary.json and summary.txt under the folder given. Each strategy
is compared with the unwrapped model's `generate` and, where run_hf.sh timed it, with `generate`
under the same wrapper (hf-<strategy>-<mode>.json)."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(out: Path) -> None:
    rows = []
    for mode in ("eager", "compiled"):
        own_path, plugin_path = out / f"hf-{mode}.json", out / f"plugin-{mode}.json"
        if not own_path.is_file() or not plugin_path.is_file():
            continue
        own = json.loads(own_path.read_text())["tokens_per_sec"]
        for row in json.loads(plugin_path.read_text())["results"]:
            same_path = out / f"hf-{row['strategy']}-{mode}.json"
            same = (
                json.loads(same_path.read_text())["tokens_per_sec"] if same_path.is_file() else None
            )
            if row["strategy"] == "auto":
                same = own
            rows.append(
                {
                    "mode": mode,
                    "test_id": row["test_id"],
                    "strategy": row["strategy"],
                    "tokens_per_sec": row["tokens_per_sec"],
                    "decode_tokens_per_sec": row["decode_tokens_per_sec"],
                    "own_generate_tokens_per_sec": own,
                    "ratio": row["tokens_per_sec"] / own,
                    "same_wrapper_generate_tokens_per_sec": same,
                    "ratio_same_wrapper": row["tokens_per_sec"] / same if same else None,
                    "verdict": row["verdict"],
                    "compiled": row["compiled"],
                    "compile_s": row["compile_s"],
                    "implementation": row["implementation"],
                    "phase_s": row["phase_s"],
                    "versions": row["versions"],
                    "device_name": row["device_name"],
                    "model_source": row.get("model_source"),
                }
            )
    (out / "summary.json").write_text(json.dumps(rows, indent=2) + "\n")
    head = f"{'mode':9} {'strategy':15} {'tok/s':>9} {'generate':>9} {'ratio':>6}"
    lines = [head + f" {'wrapped':>9} {'ratio':>6}  target 0.9"]
    for r in rows:
        same, ratio = r["same_wrapper_generate_tokens_per_sec"], r["ratio_same_wrapper"]
        lines.append(
            f"{r['mode']:9} {r['strategy']:15} {r['tokens_per_sec']:9.1f} "
            f"{r['own_generate_tokens_per_sec']:9.1f} {r['ratio']:6.2f} "
            + (f"{same:9.1f} {ratio:6.2f}" if same else f"{'-':>9} {'-':>6}")
        )
    (out / "summary.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
