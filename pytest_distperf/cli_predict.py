"""`distperf predict`'s output, and with `--mode train` each strategy's predicted step, whose
compute term needs --matmul-tflops or --step-compute-ms (the command measures nothing)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pytest_distperf.perfmodel import GB, MB, Links, Prediction, model_flops_per_step
from pytest_distperf.spec import COMM_BYTES, DEFAULT_SEQ_LENGTH, PRECISION_BYTES
from pytest_distperf.strategies import get_strategy, predict_train_for, strategy_names

if TYPE_CHECKING:
    from pytest_distperf.topology import Topology

# The table's MB/step: the nccl-tests sizes of a step's collectives (gathered output, full input).
MOVED = ("all_gather_output", "reduce_scatter_bytes", "all_reduce_bytes")


def add_train_options(
    parser: argparse.ArgumentParser, count: Callable[[str], int], rate: Callable[[str], float]
) -> None:
    """`count` and `rate`: the command's positive-number types."""
    parser.add_argument(
        "--mode",
        choices=("generate", "train"),
        default="generate",
        help="generate: tokens/sec of decoding (default); train: of an optimizer step",
    )
    parser.add_argument(
        "--seq-length",
        type=count,
        metavar="N",
        help=f"train: tokens per sequence (default: {DEFAULT_SEQ_LENGTH}, as the marker's, or the "
        "model's block_size when shorter)",
    )
    parser.add_argument(
        "--matmul-tflops",
        type=rate,
        metavar="X",
        help="train: one device's dense matmul rate at the precision, TFLOP/s (e.g. measured by "
        "a large matmul); model FLOPs over it make the compute term",
    )
    parser.add_argument(
        "--step-compute-ms",
        type=rate,
        metavar="X",
        help="train: a measured single-process step (forward, backward, AdamW) of one rank's "
        "batch, ms; replaces the FLOPs estimate",
    )


def seq_length(args: argparse.Namespace, config: Any) -> int:
    """The step's sequence length, once the training options are known to fit together."""
    if args.compute_ms_per_token:
        raise ValueError(
            "--compute-ms-per-token is a decode figure; with --mode train give --step-compute-ms"
        )
    if args.matmul_tflops is None and args.step_compute_ms is None:
        raise ValueError(
            "--mode train needs --matmul-tflops X (a device's dense matmul rate, TFLOP/s) or "
            "--step-compute-ms X (a measured single-process step): nothing is measured here"
        )
    seq = args.seq_length
    if seq is None:
        seq = min(DEFAULT_SEQ_LENGTH, config.block_size or DEFAULT_SEQ_LENGTH)
    if config.block_size and seq > config.block_size:
        raise ValueError(
            f"--seq-length {seq} exceeds {args.model}'s block_size {config.block_size}"
        )
    return seq


def train_predictions(
    args: argparse.Namespace, config: Any, seq: int, device_type: str, links: Links
) -> tuple[list[Prediction], list[tuple[str, str]]]:
    """Predictions of the chosen strategies that can train, and (name, why) for the others;
    ValueError for a strategy named with --strategy that cannot train."""
    predictions, refused = [], []
    for name in args.strategy or strategy_names():
        record = get_strategy(name)
        if record.train_refusal:
            if args.strategy:
                raise ValueError(f"--strategy {name}: cannot train: {record.train_refusal}")
            refused.append((name, record.train_refusal))
            continue
        predictions.append(
            predict_train_for(
                config,
                name,
                args.devices,
                links,
                device_type=device_type,
                batch_size=args.batch_size,
                seq_length=seq,
                # as the ranks' prediction has them (DDP's records reduce in param_bytes)
                param_bytes=PRECISION_BYTES[args.precision],
                comm_bytes=COMM_BYTES[args.precision],
                step_compute_s=args.step_compute_ms / 1e3 if args.step_compute_ms else None,
                matmul_flops_per_s=args.matmul_tflops * 1e12 if args.matmul_tflops else None,
            )
        )
    return predictions, refused


def mfu(p: Prediction, config: Any, seq_length: int, flops_per_s: float) -> float:
    """Model FLOPs per second over every device's matmul rate (what MFU means in a run)."""
    replicas = p.tokens_per_step // (p.batch_size * seq_length)
    flops = model_flops_per_step(config, p.batch_size, seq_length) * replicas
    return flops / (p.step_time_s or float("inf")) / (p.devices * flops_per_s)


def _asked(args: argparse.Namespace, *names: str) -> dict[str, Any]:
    """The command's arguments by name: its JSON's workload."""
    return {name: getattr(args, name) for name in names}


def _print_json(
    workload: dict[str, Any], topology: dict[str, Any], links: Links, **more: Any
) -> int:
    """Print `distperf predict --json`'s document, decode or training."""
    links_json = {"link_class": links.link_class, "bus_bandwidth_gbps": links.busbw / GB}
    out = {"workload": workload, "topology": topology, **links_json}
    print(json.dumps(out | {"measured_links": links.measured} | more, indent=2))
    return 0


def _print_heading(heading: str, topo: Topology, links: Links) -> None:
    kind = "measured" if links.measured else "nominal"
    print(
        f"{heading}\nslowest link {links.link_class}: {kind} all-gather bus bandwidth "
        f"{links.busbw / GB:.3g} GB/s, latency {links.latency_s * 1e6:.3g} us ({topo.source})\n"
    )


def cmd_predict_train(args: argparse.Namespace, config: Any, topo: Topology, links: Links) -> int:
    seq = seq_length(args, config)
    predictions, refused = train_predictions(args, config, seq, topo.accelerator, links)
    rate = args.matmul_tflops * 1e12 if args.matmul_tflops else None
    if args.json:
        rows = [
            p.to_dict() | ({"mfu": mfu(p, config, seq, rate)} if rate else {}) for p in predictions
        ]
        workload = _asked(args, "model", "devices", "mode", "precision", "batch_size")
        workload |= {"seq_length": seq, **_asked(args, "matmul_tflops", "step_compute_ms")}
        topology = {"key": topo.key(), "source": topo.source}
        return _print_json(workload, topology, links, predictions=rows, cannot_train=dict(refused))
    if rate:
        compute = f"model FLOPs at {args.matmul_tflops:g} TFLOP/s per device"
    else:
        compute = f"measured single-process step {args.step_compute_ms:g} ms"
    _print_heading(
        f"{args.model} training on {args.devices} {topo.accelerator} device(s), "
        f"{args.precision}, {args.batch_size} x {seq} tokens per data-parallel rank per step; "
        f"compute: {compute}",
        topo,
        links,
    )
    header = f"{'strategy':<16}{'tok/s':>9}{'ms/step':>10}{'MFU':>6}{'MB/step':>10}  bound"
    print(header)
    print("-" * (len(header) + 40))
    for p in predictions:
        utilised = f"{mfu(p, config, seq, rate):.0%}" if rate else "-"
        moved = sum(p.bytes_per_token.get(k, 0.0) for k in MOVED) / MB
        print(
            f"{p.strategy:<16}{p.tokens_per_sec:>9.3g}{(p.step_time_s or 0.0) * 1e3:>10.4g}"
            f"{utilised:>6}{moved:>10.4g}  {p.bound}: {p.bound_description}"
        )
    for name, why in refused:
        print(f"{name:<16}cannot train: {why}")
    print_terms(predictions, "step")
    return 0


def print_decode(
    args: argparse.Namespace, topo: Topology, links: Links, predictions: Sequence[Prediction]
) -> int:
    """The decode predictions of every strategy asked, as a table or JSON."""
    names = ("model", "devices", "precision", "batch_size", "prompt_length", "max_new_tokens")
    workload = _asked(args, *names)
    if args.json:
        pairs = [{"a": link.a, "b": link.b, "link_class": link.link_class} for link in topo.links]
        topology = {"key": topo.key(), "source": topo.source, "pairs": pairs}
        return _print_json(
            workload, topology, links, predictions=[p.to_dict() for p in predictions]
        )
    _print_heading(
        f"{args.model} on {args.devices} {topo.accelerator} device(s), {args.precision}, batch "
        f"{args.batch_size}, {args.prompt_length}-token prompt + {args.max_new_tokens} new tokens",
        topo,
        links,
    )
    # a step decodes one token of every batch row
    per = "token" if args.batch_size == 1 else "step"
    header = f"{'strategy':<16}{'tok/s':>9}{'ms/' + per:>10}  {'bound':<52}{'MB/token':>9}"
    print(header)
    print("-" * len(header))
    for p in predictions:
        received = p.bytes_per_token.get("all_gather_received", 0.0) / MB
        bound = f"{p.bound}: {p.bound_description}"
        print(
            f"{p.strategy:<16}{p.tokens_per_sec:>9.3g}{p.time_per_token_s * 1e3:>10.4g}  "
            f"{bound:<52}{received:>9.4g}"
        )
    print_terms(predictions, per)
    return 0


def print_terms(predictions: Sequence[Prediction], per: str) -> None:
    """Each prediction's terms in ms per `per`, then the assumptions they share."""
    print(f"\nterms (ms per {per}):")
    for p in predictions:
        terms = ", ".join(f"{k} {v * 1e3:.3g}" for k, v in p.terms.items())
        print(f"  {p.strategy:<16}{p.implementation}: {terms}")
    print("\nassumptions:")
    for text in dict.fromkeys(t for p in predictions for t in p.assumptions):
        print(f"  - {text}")
