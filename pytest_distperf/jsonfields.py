"""Reading fields of parsed JSON with errors that say where and what; writing a figure as plain
JSON (`json_value`). Standard library only."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

NUMBER: tuple[type, ...] = (int, float)
NULL = type(None)

_REQUIRED: Any = object()
_WORDS = {
    bool: "true or false",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "a list",
    tuple: "a list",
    dict: "a JSON object",
    Mapping: "a JSON object",
    NULL: "null",
}


def is_number(value: object) -> bool:
    """A JSON number: int or float, never a bool (JSON true is an int in Python)."""
    return isinstance(value, NUMBER) and not isinstance(value, bool)


def is_count(value: object) -> bool:
    """A non-negative integer that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def json_object(value: object, where: str) -> Mapping[str, Any]:
    """`value` if it is a JSON object, else ValueError naming `where`."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: expected a JSON object, got {type(value).__name__}")
    return value


def get_field(
    data: Mapping[str, Any],
    name: str,
    kind: type | tuple[type, ...],
    where: str = "",
    *,
    optional: bool = False,
    default: Any = _REQUIRED,
) -> Any:
    """`data[name]`, checked to be of `kind`; `optional`: absent or null reads None; `default`:
    what an absent field reads. A JSON bool passes only where `bool` is asked for."""
    prefix = f"{where}: " if where else ""
    if name not in data:
        if default is not _REQUIRED:
            return default
        if optional:
            return None
        raise ValueError(f"{prefix}missing field {name!r}")
    value = data[name]
    if value is None and optional:
        return None
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise ValueError(f"{prefix}field {name!r} must be {_describe(kinds)}, got {value!r}")
    return value


def _describe(kinds: tuple[type, ...]) -> str:
    if set(kinds) >= set(NUMBER):
        kinds = (float, *(k for k in kinds if k not in NUMBER))
    words = dict.fromkeys(_WORDS.get(k, k.__name__) for k in kinds)
    return " or ".join(words)


def json_value(value: Any) -> Any:
    """A figure's value as plain JSON: records as objects, tuples as lists, enums as words."""
    if isinstance(value, enum.Enum):
        return value.value
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if callable(getattr(value, "to_dict", None)):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: json_value(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {key: json_value(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_value(item) for item in value]
    return value
