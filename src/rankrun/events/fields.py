"""An event's values as a reader of the events' files takes them (pure): the JSON-object form, where a missing key, a
null, a bool where a number belongs or another type all read as ``None``. The timeline's reader (``rankrun.timeline.read``)
uses them, as a file may hold what no producer wrote; the job's own consumers take the stamped records and need none.
``ranks_in`` counts a range string's ranks, for a reader and a consumer alike."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rankrun.ranges import runs


def int_of(event: Mapping[str, Any], key: str) -> int | None:
    value = event.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def float_of(event: Mapping[str, Any], key: str) -> float | None:
    value = event.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def str_of(event: Mapping[str, Any], key: str) -> str | None:
    value = event.get(key)
    return value if isinstance(value, str) else None


def ranks_in(text: str) -> int:
    """How many ranks a range string names, from its runs (a node's 512 ranks cost what 8 do); 0 for one it cannot
    read."""
    try:
        return sum(last - first + 1 for first, last in runs(text))
    except ValueError:
        return 0
