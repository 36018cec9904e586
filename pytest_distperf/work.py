"""The counted work of a run per decode token and prefill, or per optimizer step: an unchanged
run repeats it, so the work gate compares kinds, calls and syncs exactly. Pure."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from pytest_distperf.jsonfields import NULL, NUMBER, get_field, json_object

# Short names for the table cell, in the cell's order; other kinds print under their own name.
_KINDS = ("all_gather", "reduce_scatter", "all_reduce", "broadcast", "send", "recv", "all_to_all")
KIND_ABBREVIATIONS = dict(zip(_KINDS, ("AG", "RS", "AR", "BC", "S", "R", "A2A"), strict=True))
PHASES = ("decode", "prefill", "step")
# How each phase's figures read in a message: decode is per token, prefill per generation.
_PER = {"decode": "per token", "prefill": "per prefill", "step": "per step"}
_PHASE_SCALARS = ("ops", "flops", "kernels")
_RUN_COUNTS = ("graph_breaks", "recompiles")  # compiled runs' counts, exact
_SCALAR_WORDS = {"flops": "FLOPs", "graph_breaks": "graph breaks"}  # the others: their name


@dataclass(frozen=True)
class CollectiveCount:
    """Calls of one collective kind and the bytes they move, per decode token or per prefill."""

    calls: float
    bytes: float  # nccl-tests' "size": an all-gather's output, a reduce-scatter's input

    def to_json(self) -> dict[str, float]:
        return {"calls": _whole(self.calls), "bytes": _whole(self.bytes)}

    @classmethod
    def from_json(cls, data: object, where: str) -> CollectiveCount:
        obj = _object(data, where, {"calls", "bytes"})
        return cls(_non_negative(obj, "calls", where), _non_negative(obj, "bytes", where))


@dataclass(frozen=True)
class PhaseWork:
    """One phase's work; an absent collective or sync kind made no call."""

    collectives: Mapping[str, CollectiveCount]
    ops: float  # aten ops dispatched
    flops: float  # torch.utils.flop_counter's formulas
    kernels: float | None = None  # launched (a graph replay: all its kernels); None on CPU
    # Host-device syncs by kind (an absent kind made none); None where no device was seen.
    syncs: Mapping[str, float] | None = None

    def __post_init__(self) -> None:
        # Read-only, key-sorted copies: equal work compares equal and prints in one order.
        frozen = MappingProxyType(dict(sorted(self.collectives.items())))
        object.__setattr__(self, "collectives", frozen)
        if self.syncs is not None:
            object.__setattr__(self, "syncs", MappingProxyType(dict(sorted(self.syncs.items()))))

    def __hash__(self) -> int:
        syncs = None if self.syncs is None else tuple(self.syncs.items())
        return hash((tuple(self.collectives.items()), self.ops, self.flops, self.kernels, syncs))

    def __reduce__(self) -> tuple[Any, ...]:
        # A mappingproxy does not pickle, and a rank's result travels pickled.
        syncs = None if self.syncs is None else dict(self.syncs)
        return (type(self), (dict(self.collectives), self.ops, self.flops, self.kernels, syncs))

    def to_json(self) -> dict[str, Any]:
        data = {
            "collectives": {kind: c.to_json() for kind, c in self.collectives.items()},
            "ops": _whole(self.ops),
            "flops": _whole(self.flops),
            "kernels": None if self.kernels is None else _whole(self.kernels),
        }
        if self.syncs is not None:  # absent, not zero, where no device was seen
            data["syncs"] = {kind: _whole(count) for kind, count in self.syncs.items()}
        return data

    @classmethod
    def from_json(cls, data: object, where: str) -> PhaseWork:
        obj = _object(data, where, {"collectives", "ops", "flops", "kernels", "syncs"})
        collectives = {
            kind: CollectiveCount.from_json(count, f"{where}.collectives.{kind}")
            for kind, count in get_field(obj, "collectives", Mapping, where).items()
        }
        if "" in collectives:
            raise ValueError(f"{where}.collectives: kind must be a non-empty string")
        kernels = get_field(obj, "kernels", (*NUMBER, NULL), where, optional=True)
        syncs = get_field(obj, "syncs", Mapping, where) if "syncs" in obj else None
        return cls(
            collectives=collectives,
            ops=_non_negative(obj, "ops", where),
            flops=_non_negative(obj, "flops", where),
            kernels=None if kernels is None else _non_negative(obj, "kernels", where),
            syncs=None
            if syncs is None
            else {k: _non_negative(syncs, k, f"{where}.syncs") for k in syncs},
        )


@dataclass(frozen=True)
class Work:
    """The counted work of one run: a generation's per decode token and per prefill, or a
    training run's per optimizer step. The phases a run has are set; the others are None."""

    decode: PhaseWork | None = None  # per decode token
    prefill: PhaseWork | None = None  # per generation (its one prefill)
    graph_breaks: int | None = None  # compiled runs: dynamo's graph breaks; None when eager
    recompiles: int | None = None  # compiled runs: frames compiled while counting
    step: PhaseWork | None = None  # training: one optimizer step

    def __post_init__(self) -> None:
        generation = self.decode is not None and self.prefill is not None
        if generation == (self.step is not None) or (self.decode is None) != (self.prefill is None):
            raise ValueError("Work holds decode and prefill (a generation) or a step (training)")

    def phases(self) -> tuple[tuple[str, PhaseWork], ...]:
        """(name, work) of each phase the run has, in PHASES order."""
        return tuple((n, w) for n in PHASES if (w := getattr(self, n)) is not None)

    @property
    def main(self) -> PhaseWork:
        """What repeats: the decode step of a generation, the optimizer step of training."""
        return self.step if self.step is not None else self.decode  # type: ignore[return-value]

    def to_json(self) -> dict[str, Any]:
        phases = {name: work.to_json() for name, work in self.phases()}
        return {**phases, "graph_breaks": self.graph_breaks, "recompiles": self.recompiles}

    to_dict = to_json  # jsonfields.json_value writes a record through its to_dict

    @classmethod
    def from_json(cls, data: object, where: str) -> Work:
        """Read `to_json`'s form back; a ValueError names `where` and the bad field."""
        obj = _object(data, where, {*PHASES, *_RUN_COUNTS})
        names = ("step",) if "step" in obj else ("decode", "prefill")  # training's, or not
        phases = {
            name: PhaseWork.from_json(get_field(obj, name, Mapping, where), f"{where}.{name}")
            for name in names
        }
        counts = {name: get_field(obj, name, int, where, optional=True) for name in _RUN_COUNTS}
        for name, count in counts.items():
            if count is not None and count < 0:
                raise ValueError(f"{where}: field {name!r} must be an integer >= 0, got {count!r}")
        try:
            return cls(**phases, **counts)
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None


def busiest(works: Sequence[Work]) -> Work:
    """Per counter the largest over the ranks: what the slowest rank had to do."""
    if not works:
        raise ValueError("busiest() needs the work of at least one rank")
    names = {name for name, _ in works[0].phases()}
    if any({name for name, _ in w.phases()} != names for w in works):
        raise ValueError("busiest(): the ranks counted different phases")
    return Work(
        **{name: _busiest_phase([getattr(w, name) for w in works]) for name in names},
        graph_breaks=max_known([w.graph_breaks for w in works]),
        recompiles=max_known([w.recompiles for w in works]),
    )


def _busiest_phase(phases: Sequence[PhaseWork]) -> PhaseWork:
    zero = CollectiveCount(0, 0)
    collectives = {
        kind: CollectiveCount(
            calls=max(p.collectives.get(kind, zero).calls for p in phases),
            bytes=max(p.collectives.get(kind, zero).bytes for p in phases),
        )
        for kind in sorted({kind for p in phases for kind in p.collectives})
    }
    counted = [p.syncs for p in phases if p.syncs is not None]
    kinds = sorted({kind for syncs in counted for kind in syncs})
    return PhaseWork(
        collectives=collectives,
        ops=max(p.ops for p in phases),
        flops=max(p.flops for p in phases),
        kernels=max_known([p.kernels for p in phases]),
        syncs={kind: max(s.get(kind, 0) for s in counted) for kind in kinds} if counted else None,
    )


@dataclass(frozen=True)
class WorkComparison:
    """What differs between a baseline's work and a run's, each as a message in the order a
    reader checks it: `more` work (or a new kind, more calls) fails, `less` says the baseline is
    stale; `notes`: counters the run has and the baseline was recorded without (not compared)."""

    more: tuple[str, ...]
    less: tuple[str, ...]
    notes: tuple[str, ...] = ()

    @property
    def changes(self) -> tuple[str, ...]:
        return (*self.more, *self.less)

    def message(self) -> str:
        """The changes, more work first, joined with "; "; "" when equal."""
        return "; ".join(self.changes)


# A change: (whether it is more work, its message).
_Change = tuple[bool, str]


def compare_work(baseline: Work, current: Work, tolerance: float) -> WorkComparison:
    """What changed from `baseline` to `current`: kinds and calls exactly, the rest beyond
    `tolerance` of the baseline; a counter one side could not count is skipped."""
    if not 0 <= tolerance < 1:
        raise ValueError(f"work tolerance must be in [0, 1), got {tolerance!r}")
    changes: list[_Change] = []
    notes: list[str] = []
    for phase in PHASES:
        before: PhaseWork | None = getattr(baseline, phase)
        after: PhaseWork | None = getattr(current, phase)
        if before is None or after is None:  # another mode: its test identity differs anyway
            continue
        changes.extend(_collective_changes(phase, before, after, tolerance))
        changes.extend(_sync_changes(phase, before, after))
        changes.extend(_scalar_changes(phase, _PHASE_SCALARS, before, after, tolerance))
        if before.syncs is None and after.syncs is not None:
            counted = ", ".join(f"{_number(n)} {k}" for k, n in after.syncs.items() if n)
            notes.append(
                f"host syncs {_PER[phase]} ({counted or 'none'}) not compared: the baseline "
                "was recorded before they were counted; update it to gate them"
            )
    changes.extend(_scalar_changes("", _RUN_COUNTS, baseline, current, 0.0))
    more = tuple(message for is_more, message in changes if is_more)
    less = tuple(message for is_more, message in changes if not is_more)
    return WorkComparison(more, less, tuple(notes))


def _sync_changes(phase: str, before: PhaseWork, after: PhaseWork) -> list[_Change]:
    """Host-device syncs by kind, exact as collective calls: each one stalls the host's queue."""
    if before.syncs is None or after.syncs is None:
        return []
    changes = []
    for kind in sorted(set(before.syncs) | set(after.syncs)):
        old, new = before.syncs.get(kind, 0), after.syncs.get(kind, 0)
        if old != new:
            message = f"host syncs {_PER[phase]}: {_number(old)} -> {_number(new)} ({kind})"
            changes.append((new > old, message))
    return changes


def _collective_changes(
    phase: str, before: PhaseWork, after: PhaseWork, tolerance: float
) -> list[_Change]:
    changes = []
    zero = CollectiveCount(0, 0)
    for kind in _ordered(set(before.collectives) | set(after.collectives)):
        old = before.collectives.get(kind, zero)
        new = after.collectives.get(kind, zero)
        per = _PER[phase]
        if old.calls != new.calls:
            delta = new.bytes - old.bytes
            signed = ("+" if delta >= 0 else "-") + format_bytes(abs(delta))
            message = f"{kind} {per}: {_number(old.calls)} -> {_number(new.calls)} calls ({signed})"
            # More calls, or a kind the baseline never issued, fails whatever the bytes.
            more = new.calls > old.calls or _beyond(old.bytes, new.bytes, tolerance) > 0
        elif _beyond(old.bytes, new.bytes, tolerance):
            message = (
                f"{kind} bytes {per}: {format_bytes(old.bytes)} -> {format_bytes(new.bytes)}"
                f" ({_signed_percent(old.bytes, new.bytes)})"
            )
            more = new.bytes > old.bytes
        else:
            continue
        changes.append((more, message))
    return changes


def _scalar_changes(
    phase: str, figures: Sequence[str], before: Any, after: Any, tolerance: float
) -> list[_Change]:
    """A change for each of `figures` (attributes of both) beyond `tolerance`; "" phase: a
    run-wide count, told without its percentage."""
    changes = []
    for figure in figures:
        old, new = getattr(before, figure), getattr(after, figure)
        if old is None or new is None or not _beyond(old, new, tolerance):
            continue
        words = _SCALAR_WORDS.get(figure, figure)
        if phase:
            text = _flops if figure == "flops" else _number
            change = f"{text(old)} -> {text(new)} ({_signed_percent(old, new)})"
            changes.append((new > old, f"{words} {_PER[phase]}: {change}"))
        else:
            changes.append((new > old, f"{words}: {_number(old)} -> {_number(new)}"))
    return changes


def _beyond(old: float, new: float, tolerance: float) -> int:
    """+1 or -1 when `new` is above or below `old` by more than `tolerance` of it, else 0."""
    if old == new or (old != 0 and abs(new - old) <= tolerance * abs(old)):
        return 0
    return 1 if new > old else -1


def work_cell(work: Work | None) -> str:
    """The collectives and host syncs per decode token (or step) as a table cell, ``AG 16x
    5.3GB, sync 24x``; "-" for none."""
    if work is None:
        return "-"
    parts = []
    main = work.main
    for kind in _ordered(main.collectives):
        count = main.collectives[kind]
        if count.calls == 0 and count.bytes == 0:
            continue
        part = f"{KIND_ABBREVIATIONS.get(kind, kind)} {_number(count.calls)}x"
        if count.bytes:
            part += " " + format_bytes(count.bytes).replace(" ", "")
        parts.append(part)
    if main.syncs and sum(main.syncs.values()):
        parts.append(f"sync {_number(sum(main.syncs.values()))}x")
    return ", ".join(parts) or "-"


def format_bytes(n: float) -> str:
    """Decimal units as link bandwidths are quoted: 768 B, 5.3 GB."""
    value = float(n)
    if abs(value) < 1000:
        return f"{_number(value)} B"
    for unit in ("kB", "MB", "GB", "TB"):
        value /= 1000
        if abs(value) < 1000:
            return f"{value:.3g} {unit}"
    return f"{value:.0f} TB"


def _signed_percent(old: float, new: float) -> str:
    if old == 0:
        return "from nothing" if new > 0 else "to nothing"
    return f"{(new - old) / old:+.0%}" if abs(new / old - 1) >= 0.01 else f"{new / old - 1:+.2%}"


def _flops(value: float) -> str:
    for unit, scale in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{_number(value)} FLOP"


def _number(value: float) -> str:
    """A whole count without a decimal point; a fractional one (a per-token mean) to three
    decimals below 1000, to the unit above."""
    if float(value).is_integer():
        return str(int(value))
    if abs(value) >= 1000:
        return f"{value:.0f}"
    return f"{value:.3f}".rstrip("0").rstrip(".")


def _ordered(kinds: Iterable[str]) -> list[str]:
    """Known kinds in a fixed order (all_gather first), then the others by name."""
    kinds = set(kinds)
    return [k for k in KIND_ABBREVIATIONS if k in kinds] + sorted(kinds - set(KIND_ABBREVIATIONS))


def _whole(value: float) -> float:
    return int(value) if math.isfinite(value) and float(value).is_integer() else value


def max_known(values: Iterable[Any]) -> Any:
    """The largest of the values known; None where none is."""
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _object(data: object, where: str, fields: set[str]) -> Mapping[str, Any]:
    obj = json_object(data, where)
    unknown = sorted(str(k) for k in obj.keys() - fields)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown}")
    return obj


def _non_negative(obj: Mapping[str, Any], name: str, where: str) -> float:
    value = get_field(obj, name, NUMBER, where)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{where}: field {name!r} must be a finite number >= 0, got {value!r}")
    return value
