"""An event's values as a reader of the events' files takes them (pure): the JSON-object form, where a missing key, a
null, a bool where a number belongs or another type all read as ``None``. The timeline's reader (``rankrun.timeline.read``)
uses them, as a file may hold what no producer wrote; the job's own consumers take the stamped records and need none.
``ranks_in`` counts a range string's ranks, ``size_words`` says a size in bytes and ``restored_from`` where a restored
step came from, for a reader and a consumer alike (the console's line and the timeline's mark say the same)."""

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


# decimal units, as a disk's or a link's size is said (``4.2 GB``: what a kept step holds, what a copy moved)
_SIZES = (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3))


def size_words(size: int) -> str:
    """``4.2 GB``, ``42 GB``, ``512 MB``, ``900 B``: one decimal below 10 of a unit, none from 10 on; a size that would
    round to 1000 of a unit is said in the next (``1.0 MB``, not ``1000 kB``)."""
    for unit, scale in _SIZES:
        if size >= scale - scale // 2000:
            value = size / scale
            return f"{value:.1f} {unit}" if round(value, 1) < 10 else f"{value:.0f} {unit}"
    return f"{size} B"


# where a restored step came from (``checkpoint.restored``'s ``source``), as a line says it
_RESTORED_FROM = {"memory": "kept in memory", "neighbour": "from the neighbour's copy", "disk": "from --checkpoint-dir"}


def restored_from(source: str) -> str:
    """``kept in memory``, ``from the neighbour's copy``, ``from --checkpoint-dir``; ``from X`` for a source this
    rankrun does not name."""
    return _RESTORED_FROM.get(source, f"from {source}")
