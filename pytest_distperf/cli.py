"""`distperf`: topology, predict, plot, baselines. No command imports torch; bad input exits 2
with a message naming the value and where it came from, never a traceback."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pytest_distperf import cli_baselines, cli_predict, perfmodel, topology
from pytest_distperf.output import charts
from pytest_distperf.perfmodel import GB, MB, Calibration, Links
from pytest_distperf.spec import PRECISION_BYTES, PRECISIONS, TRAIN_ONLY_PRECISIONS
from pytest_distperf.strategies import predict_all_for, strategy_names
from pytest_distperf.topology import Topology, TopologyError

USAGE_ERROR = 2


class UsageError(Exception):
    """Bad input; the message names the value and where it came from."""


def _positive(kind: type, noun: str) -> Callable[[str], Any]:
    """An argparse type: a finite `kind` above zero."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive {noun}, got {text!r}") from None
        if not 0 < value < float("inf"):
            shown = value if kind is int else repr(text)
            raise argparse.ArgumentTypeError(f"expected a positive {noun}, got {shown}")
        return value

    return parse


_positive_int, _positive_float = _positive(int, "integer"), _positive(float, "number")
# predict's optional figures (X): the flag and its help.
_FIGURES = {
    "--compute-ms-per-token": "measured single-rank ms per token (e.g. 1000 / the auto run's "
    "tok/s); default: a roofline from the memory bandwidth",
    "--memory-bandwidth-gbps": "device memory bandwidth for the roofline, GB/s (default: from "
    "the GPU model)",
    "--bus-bandwidth-gbps": "all-gather bus bandwidth of the slowest link, GB/s (default: "
    "nominal per class)",
}


def _add_source_options(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--nvidia-smi-topo",
        metavar="FILE",
        help="a saved `nvidia-smi topo -m` output (as pasted into a bug report) instead of probing",
    )
    source.add_argument(
        "--topology",
        metavar="FILE",
        help="a topology saved as JSON (`distperf topology --json`) instead of probing",
    )
    parser.add_argument(
        "--calibration",
        metavar="FILE",
        help="collective and memory figures measured in the ranks (JSON, as a run reports them)",
    )
    parser.add_argument(
        "--accelerator",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="what to probe when no file is given (auto: cuda when GPUs are visible)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="distperf",
        description="Inspect device links and predict tokens/sec per parallel strategy.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    topo = sub.add_parser(
        "topology",
        help="print the devices' link matrix with bandwidth per pair",
        description="Print the probed (or loaded) topology like `nvidia-smi topo -m`, with the "
        "bus bandwidth of every pair.",
    )
    topo.add_argument(
        "--devices",
        type=_positive_int,
        help="devices the run uses (default: all visible GPUs; 2 CPU ranks)",
    )
    _add_source_options(topo)

    pred = sub.add_parser(
        "predict",
        help="predicted tokens/sec of every strategy, with its bounding term",
        description="Predict tokens/sec per strategy on this machine or a loaded topology.",
    )
    pred.add_argument(
        "--model",
        required=True,
        help="a model preset name, e.g. llama-2-7b, or litgpt:<LitGPT config name>",
    )
    pred.add_argument("--devices", type=_positive_int, required=True, help="ranks of the run")
    pred.add_argument(
        "--strategy",
        action="append",
        choices=strategy_names(),
        help="a strategy to predict (repeatable; default: all)",
    )
    pred.add_argument("--precision", choices=PRECISIONS, default="bf16")
    pred.add_argument("--batch-size", type=_positive_int, default=1)
    pred.add_argument("--prompt-length", type=_positive_int, default=8)
    pred.add_argument("--max-new-tokens", type=_positive_int, default=50)
    for flag, text in _FIGURES.items():
        pred.add_argument(flag, type=_positive_float, metavar="X", help=text)
    cli_predict.add_train_options(pred, _positive_int, _positive_float)
    _add_source_options(pred)
    charts.add_parser(sub)
    cli_baselines.add_parser(sub)
    return parser


def _load_topology(args: argparse.Namespace, devices: int | None) -> Topology:
    """The topology the files name, else probed (auto: cuda where GPUs are visible)."""
    try:
        if args.nvidia_smi_topo:
            return topology.load_nvidia_smi_topo(args.nvidia_smi_topo, devices)
        if args.topology:
            return topology.load_topology(args.topology, devices)
    except TopologyError as exc:
        option = "--nvidia-smi-topo" if args.nvidia_smi_topo else "--topology"
        raise UsageError(f"{option}: {exc}") from None
    from pytest_distperf.topology.gpus import visible_gpus

    accelerator = args.accelerator
    if accelerator == "auto":  # as pytest's `auto` counts them
        accelerator = "cuda" if visible_gpus() else "cpu"
    if accelerator == "cpu":
        return topology.probe_cpu(devices or 2)
    if devices is None:  # every GPU NVML sees, whatever torch was built for
        try:
            return topology.probe_nvml(None)
        except Exception:  # noqa: BLE001 - probe() below says what failed
            devices = 1
    found = topology.probe(accelerator, devices)
    if found.device_count < devices:
        raise UsageError(
            f"--devices {devices}: only {found.device_count} CUDA device(s) are visible "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})"
        )
    return found


def _load_calibration(path: str | None, devices: int | None) -> Calibration | None:
    if path is None:
        return None
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"--calibration: file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--calibration: file {path} could not be read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"--calibration: file {path} is not JSON: {exc}") from None
    # The bare value, {"calibration": ...}, or a --distperf-json report (its rows carry it).
    if isinstance(data, dict) and isinstance(data.get("results"), list):
        found = [
            r["calibration"]
            for r in data["results"]
            if isinstance(r, dict) and r.get("calibration")
        ]
        if not found:
            raise UsageError(f"--calibration: report {path} holds no calibration")
        data = found[0]
    if isinstance(data, dict) and "calibration" in data:
        data = data["calibration"]
    try:
        calibration = Calibration.from_dict(data)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"--calibration: file {path} has the wrong shape: {exc}") from None
    if devices is not None and calibration.world_size != devices:
        raise UsageError(
            f"--calibration: file {path} was measured on {calibration.world_size} ranks but "
            f"--devices is {devices}"
        )
    return calibration


def _load_config(name: str) -> Any:
    """The named model's shape: a preset, or a LitGPT name (counted from its config)."""
    from pytest_distperf.models import shape_of

    try:
        shape = shape_of(name)
    except ValueError as exc:
        raise UsageError(f"--model: {exc}") from None
    if shape is None:
        raise UsageError(
            f"--model {name}: a builder's or a transformers model's shape is known only once a "
            "rank builds it"
        )
    return shape


def _pair_rows(topo: Topology) -> list[dict[str, Any]]:
    rows = []
    for link in topo.links:
        notes: list[str] = []
        busbw, latency = perfmodel.link_figures(topo, link, notes)
        rows.append(
            {
                "a": link.a,
                "b": link.b,
                "link_class": link.link_class,
                "nvlinks": link.nvlinks,
                "nominal_busbw_gbps": busbw / GB,
                "nominal_latency_us": latency * 1e6,
                "basis": notes[-1] if notes else "",
            }
        )
    return rows


def _calibration_summary(calibration: Calibration) -> dict[str, Any]:
    largest = calibration.all_gather[-1] if calibration.all_gather else None
    return {
        "world_size": calibration.world_size,
        "backend": calibration.backend,
        "all_gather_busbw_gbps": largest.busbw / GB if largest else None,
        "all_gather_bytes": largest.bytes if largest else None,
        "latency_us": calibration.latency_s * 1e6,
        "memory_bandwidth_gbps": calibration.memory_bandwidth / GB,
        "overlap": calibration.overlap,
    }


def cmd_topology(args: argparse.Namespace) -> int:
    topo = _load_topology(args, args.devices)
    calibration = _load_calibration(args.calibration, topo.device_count)
    pairs = _pair_rows(topo)
    if args.json:
        out: dict[str, Any] = {
            "key": topo.key(),
            "source": topo.source,
            "accelerator": topo.accelerator,
            "devices": topo.device_count,
            "slowest_link": topo.slowest_link().link_class if topo.links else None,
            "pairs": pairs,
            "topology": topo.to_dict(),
            "notes": list(topo.notes),
        }
        if calibration is not None:
            out["measured"] = _calibration_summary(calibration)
        print(json.dumps(out, indent=2))
        return 0
    print(
        f"{topo.device_count} {topo.accelerator} device(s), {topo.device_model}; source: "
        f"{topo.source}; key: {topo.key()}\n\n{topo.matrix()}",
        end="",
    )
    if pairs:
        print("\nNominal all-gather bus bandwidth per pair (GB/s):")
        by_pair = {(p["a"], p["b"]): p["nominal_busbw_gbps"] for p in pairs}
        print(topo.matrix(lambda a, b: f"{by_pair[min(a, b), max(a, b)]:.3g}", "X"))
        for p in pairs:
            print(f"  {p['a']}-{p['b']} {p['link_class']}: {p['basis']}")
    if calibration is not None:
        m = _calibration_summary(calibration)
        print(
            f"\nMeasured ({m['backend']}, {m['world_size']} ranks): all-gather bus bandwidth "
            f"{m['all_gather_busbw_gbps']:.3g} GB/s at {m['all_gather_bytes'] / MB:.4g} MB, "
            f"latency {m['latency_us']:.3g} us, memory {m['memory_bandwidth_gbps']:.4g} GB/s, "
            f"transfer/host overlap {m['overlap']:.0%}"
        )
    if topo.notes:
        print("\n" + "\n".join(f"note: {note}" for note in topo.notes))
    return 0


def _inputs(args: argparse.Namespace) -> tuple[Any, Topology, Links]:
    config = _load_config(args.model)
    topo = _load_topology(args, args.devices)
    if topo.device_count < args.devices:
        raise UsageError(
            f"--devices {args.devices}: the topology ({topo.source}) has only "
            f"{topo.device_count} device(s)"
        )
    calibration = _load_calibration(args.calibration, args.devices)
    memory, bus = args.memory_bandwidth_gbps, args.bus_bandwidth_gbps
    try:
        links = perfmodel.run_links(
            topo,
            args.devices,
            calibration,
            memory_bandwidth=memory * GB if memory else None,
            bus_bandwidth=bus * GB if bus else None,
        )
    except ValueError as exc:
        raise UsageError(f"--devices {args.devices}: {exc}") from None
    return config, topo, links


def cmd_predict(args: argparse.Namespace) -> int:
    if args.mode == "train":
        config, topo, links = _inputs(args)
        try:
            return cli_predict.cmd_predict_train(args, config, topo, links)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if args.precision in TRAIN_ONLY_PRECISIONS:
        raise UsageError(f"--precision {args.precision}: training only (--mode train)")
    config, topo, links = _inputs(args)
    if args.prompt_length + args.max_new_tokens > config.block_size:
        raise UsageError(
            f"--prompt-length {args.prompt_length} + --max-new-tokens {args.max_new_tokens} "
            f"exceeds {args.model}'s block_size {config.block_size}"
        )
    predictions = predict_all_for(
        config,
        args.devices,
        links,
        args.strategy,
        device_type=topo.accelerator,
        batch_size=args.batch_size,
        prompt_length=args.prompt_length,
        max_new_tokens=args.max_new_tokens,
        dtype_bytes=PRECISION_BYTES[args.precision],
        compute_time_s=args.compute_ms_per_token / 1e3 if args.compute_ms_per_token else None,
    )
    return cli_predict.print_decode(args, topo, links, predictions)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # argparse itself exits 2 on malformed options
    handler = {
        "topology": cmd_topology,
        "predict": cmd_predict,
        "plot": charts.cmd_plot,
        "baselines": cli_baselines.cmd_baselines,
    }
    try:
        return handler[args.command](args)
    except (UsageError, charts.ChartError, cli_baselines.BaselinesError) as exc:
        print(f"distperf {args.command}: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except BrokenPipeError:
        # `distperf predict ... | head`: the reader left; nothing to report.
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
