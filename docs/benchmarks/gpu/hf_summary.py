"""The plugin's tok/s over the model's own `generate` (eager with eager, compiled with compiled)
from run_hf.sh's JSON files: summary.json and summary.txt under the folder given."""

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
            rows.append(
                {
                    "mode": mode,
                    "test_id": row["test_id"],
                    "strategy": row["strategy"],
                    "tokens_per_sec": row["tokens_per_sec"],
                    "decode_tokens_per_sec": row["decode_tokens_per_sec"],
                    "own_generate_tokens_per_sec": own,
                    "ratio": row["tokens_per_sec"] / own,
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
    lines = [f"{'mode':9} {'strategy':15} {'tok/s':>9} {'generate':>9} {'ratio':>6}  target 0.9"]
    for r in rows:
        lines.append(
            f"{r['mode']:9} {r['strategy']:15} {r['tokens_per_sec']:9.1f} "
            f"{r['own_generate_tokens_per_sec']:9.1f} {r['ratio']:6.2f}"
        )
    (out / "summary.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
