"""How the CUDA runtime numbers devices (CUDA_VISIBLE_DEVICES) and PCI bus ids in NVML's form,
for the probes that see every GPU of the host and report the run's under its CUDA indices."""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Sequence
from typing import Any


def resolve_visible_devices(
    value: str | None, uuids: Sequence[str]
) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """(NVML index of cuda:0, cuda:1, ...) and notes, as the CUDA runtime reads `value` (None:
    unset) over `uuids` in NVML (PCI) order: an entry that names no device, or repeats one, ends
    the list. Integers count in PCI order, CUDA's too but for a mixed box's FASTEST_FIRST."""
    if value is None:
        return tuple(range(len(uuids))), ()
    chosen: list[int] = []
    notes: list[str] = []
    for raw in value.split(","):
        entry = raw.strip()
        if entry.upper().startswith("MIG-"):
            raise ValueError(
                f"CUDA_VISIBLE_DEVICES={value!r} names a MIG instance; a MIG slice has no link "
                "topology of its own, so links are not probed"
            )
        index: int | None = None
        if re.fullmatch(r"[+-]?\d+", entry):
            n = int(entry)
            index = n if 0 <= n < len(uuids) else None
        elif entry.upper().startswith("GPU-"):
            # CUDA accepts any unambiguous UUID prefix.
            hits = [i for i, u in enumerate(uuids) if u.lower().startswith(entry.lower())]
            index = hits[0] if len(hits) == 1 else None
        if index is None or index in chosen:
            if entry:
                notes.append(
                    f"CUDA_VISIBLE_DEVICES={value!r}: {entry!r} names no further device, so it "
                    "and the entries after it are ignored, as CUDA does"
                )
            break
        chosen.append(index)
    return tuple(chosen), tuple(notes)


def run_devices(
    uuids: Sequence[str], indices: Sequence[int] | None, present: Collection[int] | None = None
) -> tuple[tuple[int, ...], list[int], list[str]]:
    """(NVML index of each CUDA index, the CUDA indices the run uses, notes): `indices` (None:
    all visible) checked against what CUDA_VISIBLE_DEVICES shows of `uuids` (and `present`)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible, env_notes = resolve_visible_devices(env, uuids)
    if present is not None:
        visible = tuple(v for v in visible if v in present)
    wanted = list(range(len(visible))) if indices is None else list(indices)
    shown = "unset" if env is None else repr(env)
    for i in wanted:
        if not 0 <= i < len(visible):
            raise ValueError(
                f"the run uses cuda:{i} but only {len(visible)} CUDA device(s) are visible "
                f"(CUDA_VISIBLE_DEVICES {shown})"
            )
    if len(set(wanted)) != len(wanted):
        raise ValueError(f"device indices repeat: {wanted}")
    notes = list(env_notes)
    if any(visible[i] != i for i in wanted):
        pairs = ", ".join(f"cuda:{i}=GPU{visible[i]}" for i in wanted)
        notes.append(
            f"CUDA_VISIBLE_DEVICES={env!r} maps the run's devices to nvidia-smi's numbers: {pairs}"
        )
    return visible, wanted, notes


def as_text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def normal_bus_id(value: Any) -> str | None:
    """NVML's PCI bus id form ("00000000:19:00.0"), or None for its no-device placeholder."""
    m = re.fullmatch(
        r"(?:([0-9a-f]+):)?([0-9a-f]+):([0-9a-f]+)\.([0-9a-f]+)", as_text(value).strip().lower()
    )
    if not m:
        return None
    domain, bus, dev, fn = (int(g or "0", 16) for g in m.groups())
    # An NVLink whose far end is an NVSwitch reports the placeholder FFFFFFFF:FF:FF.0.
    if domain == 0xFFFFFFFF or bus == 0xFF:
        return None
    return f"{domain:08X}:{bus:02X}:{dev:02X}.{fn:X}"
