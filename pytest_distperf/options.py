"""Session settings and per-test workloads, validated, with errors that name their source. The
most specific wins (pytest-timeout's rule): marker, command line, ini file, default. No torch."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from functools import partial
from typing import Any

from pytest_distperf.jsonfields import is_count, is_number
from pytest_distperf.perfmodel import DEFAULT_EFFICIENCY
from pytest_distperf.spec import (
    DEFAULT_SEQ_LENGTH,
    HF_PREFIX,
    LITGPT_PREFIX,
    MODES,
    PRECISIONS,
    TRAIN_ONLY_PRECISIONS,
    Workload,
)

ACCELERATORS = ("auto", "cpu", "cuda")
# torch.numa.binding.AffinityMode values (torch's own NUMA binding, as `torchrun --numa-binding`)
NUMA_BINDINGS = ("node", "socket", "exclusive", "core-complex")


class SettingError(ValueError):
    """A setting with a bad value; the message names the value and where it came from."""


def _integer(raw: str, source: str, minimum: int = 1) -> int:
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise SettingError(f"{source}: expected an integer, got {raw!r}") from None
    if value < minimum:
        raise SettingError(f"{source}: must be >= {minimum}, got {value}")
    return value


def _one_of(choices: tuple[str, ...], raw: str, source: str) -> str:
    value = str(raw).strip().lower()
    if value not in choices:
        raise SettingError(f"{source}: {raw!r} is not one of {', '.join(choices)}")
    return value


def _float(raw: Any, source: str, expected: str) -> float:
    try:
        return float(raw)
    except (TypeError, ValueError):
        raise SettingError(f"{source}: {expected}, got {raw!r}") from None


def _timeout(raw: str, source: str) -> float:
    value = _float(raw, source, "expected a number of seconds")
    if not (value > 0 and math.isfinite(value)):
        raise SettingError(f"{source}: must be a finite number of seconds > 0, got {raw!r}")
    return value


def _fraction(raw: Any, source: str, name: str, bounds: str = "(0, 1)") -> float:
    """A number within `bounds` of 0 and 1, each end open "(" or closed "]" as written."""
    value = _float(raw, source, f"{name} must be a number")
    above = value >= 0 if bounds.startswith("[") else value > 0
    below = value <= 1 if bounds.endswith("]") else value < 1
    if isinstance(raw, bool) or not (above and below):
        raise SettingError(f"{source}: {name} must be in {bounds}, got {raw!r}")
    return value


def _on_off(raw: Any, source: str) -> bool:
    value = str(raw).strip().lower()
    if value not in ("on", "off"):
        raise SettingError(f"{source}: expected on or off, got {raw!r}")
    return value == "on"


def _switch(raw: Any, source: str) -> bool:
    if isinstance(raw, bool):
        return raw
    value = str(raw).strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise SettingError(f"{source}: expected true or false, got {raw!r}")


def _optional(parse: Callable[[str, str], Any]) -> Callable[[str, str], Any]:
    """An unset value ("") reads None; the rest as `parse` reads it."""
    return lambda raw, source: parse(raw, source) if str(raw).strip() else None


def _devices(raw: str, source: str) -> int | None:
    return None if str(raw).strip().lower() == "auto" else _integer(raw, source)


def _path(raw: str, source: str) -> str | None:
    return raw or None


@dataclass(frozen=True)
class OptionSpec:
    """One setting with its CLI and ini forms sharing one help string (as pytest-timeout does)."""

    name: str  # e.g. "devices" -> --distperf-devices / distperf_devices
    default: str
    help: str
    parse: Callable[[Any, str], Any] = _path  # (raw value, where it came from) -> the setting

    @property
    def is_flag(self) -> bool:
        """A switch: store_true on the command line, a bool in the ini file."""
        return self.parse is _switch

    @property
    def flag(self) -> str:
        return "--distperf-" + self.name.replace("_", "-")

    @property
    def ini(self) -> str:
        return "distperf_" + self.name


def _option(default: str, help: str, parse: Callable[[Any, str], Any] = _path) -> Any:
    """A Settings field declared as its option: the unparsed default, one help string, a parser."""
    return field(metadata={"default": default, "help": help, "parse": parse})


@dataclass(frozen=True)
class Settings:
    """What the whole session runs with, each field an option (--distperf-<name>, ini
    distperf_<name>) declared once; `devices` is None for 'auto' until resolved."""

    devices: int | None = _option(
        "2", "ranks per test: a positive integer, or 'auto' for all visible GPUs", _devices
    )
    accelerator: str = _option(
        "auto",
        "where ranks run: auto (cuda when visible), cpu or cuda",
        partial(_one_of, ACCELERATORS),
    )
    repeats: int = _option("5", "timed generations per test (the median is reported)", _integer)
    warmup: int = _option(
        "1", "untimed generations before the timed ones", partial(_integer, minimum=0)
    )
    timeout: float = _option(
        "600", "seconds a test's ranks may run before they are stopped", _timeout
    )
    json: str | None = _option("", "write every distperf result of the session to this JSON file")
    efficiency: float = _option(
        str(DEFAULT_EFFICIENCY),
        "fail a run below this fraction of the predicted tokens/sec, in (0, 1]",
        partial(_fraction, name="efficiency", bounds="(0, 1]"),
    )
    tolerance: float | None = _option(
        "",
        "relative drop from the baseline tolerated; default: from the drift of the recorded runs",
        _optional(partial(_fraction, name="tolerance")),
    )
    gates: bool = _option(
        "on",
        "on or off; off: every run is measured and reported but no check (threshold, baseline, "
        "relative speed, memory, work, device time) fails it (a test's distperf(gates=...) wins)",
        _on_off,
    )
    alpha: float = _option(
        "0.01",
        "false-alarm rate of the baseline test: a regression needs p <= alpha",
        partial(_fraction, name="alpha"),
    )
    count: bool = _option(
        "on",
        "on or off; off: no counted generation after the timed repeats (collectives, ops, "
        "FLOPs, kernels per token), so no work gate",
        _on_off,
    )
    work_tolerance: float = _option(
        "0.01",
        "relative growth of the counted bytes, ops, FLOPs and kernels per token the work gate "
        "tolerates, in [0, 1); collective kinds and calls are exact (a test's "
        "distperf(work_tolerance=...) wins)",
        partial(_fraction, name="work_tolerance", bounds="[0, 1)"),
    )
    baseline_dir: str | None = _option(
        "", "directory of baseline files (default: <rootdir>/distperf-baselines)"
    )
    update_baselines: bool = _option(
        "", "record or refresh the baselines of the tests run", _switch
    )
    strict: bool = _option("", "a test without a baseline for this machine fails", _switch)
    fail_on_improvement: bool = _option(
        "", "a run far faster than its baseline (stale) fails", _switch
    )
    compile: bool = _option(
        "",
        "compile the decode step with torch.compile (CUDA graphs where the strategy allows); "
        "a test's distperf(compile=...) wins",
        _switch,
    )
    fresh_ranks: bool = _option(
        "",
        "start new ranks for every test instead of keeping a pool for the session (debugging)",
        _switch,
    )
    recalibrate: bool = _option(
        "",
        "measure the collectives again instead of reusing this machine's calibration kept in "
        "pytest's cache (same topology, rank count and versions)",
        _switch,
    )
    relative_speed: bool = _option(
        "",
        "time the bare model beside every repeat (relative speed) for replicated strategies "
        "too (auto, ddp); sharded and model-parallel strategies always measure it (a test's "
        "distperf(relative_speed=...) wins)",
        _switch,
    )
    topology: str | None = _option(
        "", "load this saved topology (JSON) instead of probing the machine"
    )
    numa_binding: str | None = _option(
        "",
        "bind each CUDA rank to CPUs near its GPU with torch's NUMA binding: "
        f"{', '.join(NUMA_BINDINGS)} (default: no binding; inside torchrun use its --numa-binding)",
        _optional(partial(_one_of, NUMA_BINDINGS)),
    )

    def gate_value(self, name: str, marker: Mapping[str, Any]) -> Any:
        """The most specific setting wins, as in pytest-timeout: marker > command line > ini."""
        return marker.get(name, getattr(self, name))


OPTIONS = tuple(OptionSpec(f.name, **f.metadata) for f in fields(Settings))
_BY_NAME = {spec.name: spec for spec in OPTIONS}


def resolve_settings(
    cli: Mapping[str, str | None], ini: Mapping[str, str | None], ini_file: str | None = None
) -> Settings:
    """Build Settings from CLI values (None when absent) and ini values (None or '' when absent)."""
    values: dict[str, Any] = {}
    for spec in OPTIONS:
        raw, source = spec.default, "default"
        ini_value = ini.get(spec.name)
        if ini_value not in (None, ""):
            raw, source = str(ini_value), f"ini option {spec.ini} in {ini_file or 'the ini file'}"
        cli_value = cli.get(spec.name)
        if cli_value is not None and cli_value is not False:  # an unset switch is False
            raw, source = str(cli_value), f"command-line option {spec.flag}"
        values[spec.name] = spec.parse(raw, f"{source} = {raw!r}")
    return Settings(**values)


def workload_from_marker(
    kwargs: Mapping[str, Any], where: str, known_models: tuple[str, ...]
) -> Workload:
    """Validate `distperf(...)` marker arguments; `where` names the test for the message."""
    fields = {f.name: f for f in dataclasses.fields(Workload)}
    unknown = sorted(set(kwargs) - set(fields) - set(GATE_ARGUMENTS))
    if unknown:
        raise SettingError(
            f"{where}: unknown distperf marker argument(s) {', '.join(unknown)}; "
            f"valid: {', '.join([*fields, *GATE_ARGUMENTS])}"
        )
    gate_from_marker(kwargs, where)  # validated here too, so collection reports it
    values = {**Workload().params(), **{k: v for k, v in kwargs.items() if k in fields}}
    model = values["model"]
    named = isinstance(model, str) and any(
        model.startswith(prefix) and model != prefix for prefix in (LITGPT_PREFIX, HF_PREFIX)
    )
    if not isinstance(model, str) or not (model in known_models or named or _is_import_path(model)):
        raise SettingError(
            f"{where}: distperf(model={model!r}) is not a known model; valid: "
            f"{', '.join(known_models)}, '{LITGPT_PREFIX}<LitGPT config name>', "
            f"'{HF_PREFIX}<config folder, file or hub id>', or "
            "'package.module:function' naming your own builder"
        )
    for name, valid, rule in _RULES:
        if not valid(values[name]):
            raise SettingError(f"{where}: distperf({name}={values[name]!r}) {rule}")
    values["seq_length"] = _mode_arguments(values, set(kwargs), where)
    values.update(slowdown=float(values["slowdown"]), comm_delay=float(values["comm_delay"]))
    return Workload(**values)


def _import_path_or_none(value: object) -> bool:
    return value is None or (isinstance(value, str) and _is_import_path(value))


def _positive_count(value: object) -> bool:
    return is_count(value) and value >= 1  # type: ignore[operator]


# Marker arguments checked one by one: (name, whether a value is valid, what it must be).
_RULES: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("generate", _import_path_or_none, "must be 'package.module:function'"),
    ("shard_unit", _import_path_or_none, "must be 'package.module:Class'"),
    ("tp_plan", _import_path_or_none, "must be 'package.module:function'"),
    ("precision", lambda v: v in PRECISIONS, f"is not one of {', '.join(PRECISIONS)}"),
    ("max_new_tokens", _positive_count, "must be a positive integer"),
    ("prompt_length", _positive_count, "must be a positive integer"),
    ("batch_size", _positive_count, "must be a positive integer"),
    ("seed", lambda v: is_number(v) and isinstance(v, int), "must be an integer"),
    ("slowdown", lambda v: is_number(v) and 0 <= v < 1, "must be in [0, 1)"),
    (
        "comm_delay",
        lambda v: is_number(v) and 0 <= v <= 1,
        "must be seconds in [0, 1] per message",
    ),
    ("compile", lambda v: v in (None, True, False), "must be True or False"),
    ("mode", lambda v: v in MODES, f"is not one of {', '.join(MODES)}"),
    ("seq_length", lambda v: v is None or _positive_count(v), "must be a positive integer"),
)
# Marker arguments that only a generation uses: refused in train mode rather than ignored.
_GENERATE_ONLY = ("max_new_tokens", "prompt_length", "generate")


def _mode_arguments(values: Mapping[str, Any], given: set[str], where: str) -> int | None:
    """Check what goes with `mode`; the train mode's sequence length (None otherwise)."""
    mode, seq_length = values["mode"], values["seq_length"]
    if mode != "train":
        if seq_length is not None:
            raise SettingError(
                f"{where}: distperf(seq_length={seq_length!r}) is a train-mode argument; "
                "add mode='train', or set prompt_length and max_new_tokens for a generation"
            )
        if values["precision"] in TRAIN_ONLY_PRECISIONS:
            raise SettingError(
                f"{where}: distperf(precision={values['precision']!r}) is for mode='train'; "
                "a generation runs in fp32, bf16 or fp16"
            )
        return None
    misplaced = sorted(given & set(_GENERATE_ONLY))
    if misplaced:
        raise SettingError(
            f"{where}: distperf({', '.join(misplaced)}) does not apply to mode='train' (a step "
            "trains on batch_size sequences of seq_length tokens)"
        )
    return DEFAULT_SEQ_LENGTH if seq_length is None else seq_length


GATE_ARGUMENTS = ("efficiency", "tolerance", "gates", "work_tolerance", "relative_speed")


def gate_from_marker(kwargs: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The marker's per-test twins of their options (GATE_ARGUMENTS), parsed as the options are;
    the switches' twins take True or False."""
    gate: dict[str, Any] = {}
    for name in (name for name in GATE_ARGUMENTS if name in kwargs):
        value, source = kwargs[name], f"{where}: distperf({name}={kwargs[name]!r})"
        if name not in ("gates", "relative_speed"):
            gate[name] = _BY_NAME[name].parse(value, source)
        elif isinstance(value, bool):
            gate[name] = value
        else:
            raise SettingError(f"{source}: {name} must be True or False")
    return gate


def _is_import_path(value: str) -> bool:
    module, _, function = value.partition(":")
    return (
        bool(module)
        and function.isidentifier()
        and all(part.isidentifier() for part in module.split("."))
    )


def env_slowdown(environ: Mapping[str, str] = os.environ) -> float | None:
    """DISTPERF_SLOWDOWN overrides every test's slowdown (for self-checks of the gates)."""
    raw = environ.get("DISTPERF_SLOWDOWN")
    if raw in (None, ""):
        return None
    return _fraction(raw, f"environment variable DISTPERF_SLOWDOWN={raw!r}", "it", "[0, 1)")
