"""Slurm hostlist expressions expanded in pure Python: golden expansions, errors, and a round trip with a compressor."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rankrun.hostlist import expand


@pytest.mark.parametrize(("text", "hosts"), [
    ("node1", ["node1"]),
    ("rack[0-1]-node[01-02]", ["rack0-node01", "rack0-node02", "rack1-node01", "rack1-node02"]),  # Lightning: "rack0"
    ("n[001-003,010]", ["n001", "n002", "n003", "n010"]),
    ("a,b[1-2],c", ["a", "b1", "b2", "c"]),
    ("gpu[08-11]", ["gpu08", "gpu09", "gpu10", "gpu11"]),  # the width of the low bound
    ("x[9-11]", ["x9", "x10", "x11"]),
    ("n[1,3-4]-ib", ["n1-ib", "n3-ib", "n4-ib"]),
    ("[1-2]", ["1", "2"]),
    ("h-1.example.com,h-2.example.com", ["h-1.example.com", "h-2.example.com"]),
])
def test_golden_expansions(text: str, hosts: list[str]) -> None:
    assert expand(text) == hosts


@pytest.mark.parametrize(("text", "why"), [
    ("n[1-2", "'[' without ']'"),
    ("n1-2]", "']' without '['"),
    ("n[1-[2]]", "nested '['"),
    ("n[]", "an empty '[]'"),
    ("n[3-1]", "runs backwards"),
    ("n[a-b]", "is not a number or a range"),
    ("n[1-]", "is not a number or a range"),
    ("a,,b", "an empty host between commas"),
    ("", "empty"),
    ("n[0-999999999]", "too large"),
])
def test_invalid_patterns_say_why(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=re.escape(why)):
        expand(text)


def _compress(hosts: list[str]) -> str:
    """A small compressor: runs of ``prefix<digits>`` with the same prefix and width into ``prefix[lo-hi,...]``."""
    out: list[str] = []
    i = 0
    while i < len(hosts):
        m = re.fullmatch(r"(.*?)(\d+)", hosts[i])
        if m is None:
            out.append(hosts[i])
            i += 1
            continue
        prefix, width = m.group(1), len(m.group(2))
        numbers = [m.group(2)]
        j = i + 1
        while j < len(hosts) and (n := re.fullmatch(re.escape(prefix) + r"(\d+)", hosts[j])) and len(n.group(1)) == width \
                and int(n.group(1)) > int(numbers[-1]):
            numbers.append(n.group(1))
            j += 1
        spans: list[list[str]] = []
        for num in numbers:
            if spans and int(num) == int(spans[-1][-1]) + 1:
                spans[-1] = [spans[-1][0], num]
            else:
                spans.append([num])
        out.append(f"{prefix}[{','.join('-'.join(s) for s in spans)}]")
        i = j
    return ",".join(out)


@given(st.lists(st.tuples(st.sampled_from(["node", "gpu-", "r1n"]), st.integers(0, 300), st.sampled_from([0, 3])),
                min_size=1, max_size=40))
def test_expanding_what_a_compressor_wrote_gives_the_hosts_back(spec: list[tuple[str, int, int]]) -> None:
    hosts = list(dict.fromkeys(f"{prefix}{str(n).zfill(width) if width else n}" for prefix, n, width in spec))
    assert expand(_compress(hosts)) == hosts
