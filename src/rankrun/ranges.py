"""Ranks (or CPUs) as a range string: ``[0, 1, 2, 3, 8, 10]`` ↔ ``"0-3,8,10"`` (pure): the event schema's ranks, the
stack reports' rank lists, ``--numa-binding``'s CPU lists.

Sorted, de-duplicated, comma-separated runs; a run of two or more consecutive ranks is ``a-b``; no ranks is ``""``.
A set of any size that has no gaps is one run, so a 16,384-rank job's ``"0-16383"`` is as short as a 2-rank one's.
"""

from __future__ import annotations

from collections.abc import Iterable


def range_string(ranks: Iterable[int]) -> str:
    """``{4, 0, 1, 2, 2}`` → ``"0-2,4"``. A negative rank is a ``ValueError`` (``"-1"`` would read as a run)."""
    ordered = sorted(set(ranks))
    if ordered and ordered[0] < 0:
        raise ValueError(f"a rank is never negative: {ordered[0]}")
    runs: list[str] = []
    start = 0
    for i in range(1, len(ordered) + 1):
        if i == len(ordered) or ordered[i] != ordered[i - 1] + 1:  # the run that began at ``start`` ends at i - 1
            first, last = ordered[start], ordered[i - 1]
            runs.append(str(first) if first == last else f"{first}-{last}")
            start = i
    return ",".join(runs)


def runs(text: str) -> list[tuple[int, int]]:
    """A range string's runs as written, ``"0-2,4"`` → ``[(0, 2), (4, 4)]``: what a reader that only counts or tests
    membership needs, at the cost of the runs, never of the ranks (a node's 512 ranks cost what 8 do).

    Anything else — an empty item, a sign, a reversed run ``"5-3"``, a space — is a ``ValueError`` naming it.
    """
    if text == "":
        return []
    found: list[tuple[int, int]] = []
    for item in text.split(","):
        first, dash, last = item.partition("-")
        if not first.isdigit() or (dash and not last.isdigit()) or not first.isascii() or not last.isascii():
            raise ValueError(f"not a rank or a run of ranks: {item!r} in {text!r}")
        low, high = int(first), int(last) if dash else int(first)
        if high < low:
            raise ValueError(f"a run of ranks goes up: {item!r} in {text!r}")
        found.append((low, high))
    return found


def parse_ranges(text: str) -> list[int]:
    """The inverse of ``range_string``: ``"0-2,4"`` → ``[0, 1, 2, 4]`` (sorted, de-duplicated whatever the order given).
    A malformed string is a ``ValueError`` (``runs``)."""
    return sorted({rank for low, high in runs(text) for rank in range(low, high + 1)})
