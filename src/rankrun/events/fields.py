"""An event's values read by a consumer that must never raise on what it is given (pure): the JSON-object form, where
a missing key, a null, a bool where a number belongs or another type all read as ``None``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def int_of(event: Mapping[str, Any], key: str) -> int | None:
    value = event.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def float_of(event: Mapping[str, Any], key: str) -> float | None:
    value = event.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def str_of(event: Mapping[str, Any], key: str) -> str | None:
    value = event.get(key)
    return value if isinstance(value, str) else None
