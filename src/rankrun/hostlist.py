"""Slurm's hostlist expressions, expanded in the standard library (pure): never a call to ``scontrol``.

The grammar (Slurm's ``hostlist``): a comma-separated list of host expressions, the commas inside brackets not
counting; each expression is literal text with any number of bracket groups, ``prefix[ranges]middle[ranges]...``;
a group holds a comma-separated list of numbers and ``lo-hi`` ranges, and a number written with leading zeros keeps
its width (``n[08-10]`` is ``n08 n09 n10``). Several groups multiply, the first outermost::

    rack[0-1]-node[01-02]  ->  rack0-node01 rack0-node02 rack1-node01 rack1-node02
    n[001-003,010]         ->  n001 n002 n003 n010
    a,b[1-2],c             ->  a b1 b2 c

Anything else (an unclosed or nested bracket, an empty group, ``hi < lo``, a letter in a range) raises
``ValueError`` with the reason, for a one-line message.
"""

from __future__ import annotations

import itertools

MAX_HOSTS = 1_000_000  # an expression that would expand past this is refused, not expanded


def _split_top(text: str) -> list[str]:
    """``text`` split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            if depth:
                raise ValueError(f"nested '[' at position {i}")
            depth = 1
        elif ch == "]":
            if not depth:
                raise ValueError(f"']' without '[' at position {i}")
            depth = 0
        elif ch == "," and not depth:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError("'[' without ']'")
    parts.append(text[start:])
    return parts


def _numbers(group: str) -> list[str]:
    """One bracket group's contents, ``1-3,07`` → ``["1", "2", "3", "07"]``."""
    out: list[str] = []
    for item in group.split(","):
        lo, dash, hi = item.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ValueError(f"[{group}]: {item!r} is not a number or a range lo-hi")
        if not dash:
            out.append(lo)
            continue
        if int(hi) < int(lo):
            raise ValueError(f"[{group}]: the range {item!r} runs backwards")
        width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
        if int(hi) - int(lo) >= MAX_HOSTS:
            raise ValueError(f"[{group}]: the range {item!r} is too large")
        out += [str(n).zfill(width) for n in range(int(lo), int(hi) + 1)]
    return out


def _expand_one(expression: str) -> list[str]:
    pieces: list[list[str]] = []  # literal text and groups in order, each a list of alternatives
    rest = expression
    while "[" in rest:
        head, _, tail = rest.partition("[")
        group, _, rest = tail.partition("]")
        if not group:
            raise ValueError(f"{expression!r}: an empty '[]'")
        pieces += [[head], _numbers(group)]
    pieces.append([rest])
    total = 1
    for alternatives in pieces:
        total *= len(alternatives)
    if total > MAX_HOSTS:
        raise ValueError(f"{expression!r} expands to more than {MAX_HOSTS:,} hosts")
    return ["".join(parts) for parts in itertools.product(*pieces)]


def expand(hostlist: str) -> list[str]:
    """Every host of a Slurm hostlist expression, in Slurm's order; ``ValueError`` says what is wrong."""
    text = hostlist.strip()
    if not text:
        raise ValueError("empty")
    hosts: list[str] = []
    for expression in _split_top(text):
        if not expression:
            raise ValueError(f"{hostlist!r}: an empty host between commas")
        hosts += _expand_one(expression)
    return hosts
