"""The worker store's keyspace on its own (pure: no sockets, no loop): torch's libuv semantics, table by table."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rankrun.workerstore.keyspace import Keyspace, NotAnInteger, parse_int


@pytest.mark.parametrize(("text", "number"), [
    (b"42", 42), (b"  -7xyz", -7), (b"+3", 3), (b"\t\n12", 12), (b"", None), (b"abc", None),
    (b"9223372036854775807", 2**63 - 1), (b"9223372036854775808", None), (b"-9223372036854775808", -(2**63)),
])
def test_integers_are_read_as_strtoll_reads_them(text, number):
    assert parse_int(text) == number


def test_add_counts_from_zero_wraps_like_int64_and_refuses_text():
    ks = Keyspace()
    assert ks.add(b"c", 5) == 5
    assert ks.values[b"c"] == b"5"
    ks.set(b"max", b"9223372036854775807")
    assert ks.add(b"max", 1) == -(2**63)  # the C++ server's two's-complement addition
    ks.set(b"word", b"hello")
    with pytest.raises(NotAnInteger):
        ks.add(b"word", 1)


@given(st.lists(st.integers(-(2**40), 2**40), max_size=20))
def test_add_is_the_sum(deltas):
    ks = Keyspace()
    for delta in deltas:
        ks.add(b"k", delta)
    assert parse_int(ks.values.get(b"k", b"0")) == sum(deltas)


def test_compare_set_replaces_only_on_a_match_and_keeps_torchs_missing_key_quirk():
    ks = Keyspace()
    assert ks.compare_set(b"k", b"", b"first") == b"first"  # missing and expected empty: created
    assert ks.compare_set(b"k", b"wrong", b"second") == b"first"  # no match: the current value
    assert ks.compare_set(b"k", b"first", b"second") == b"second"
    assert ks.compare_set(b"absent", b"x", b"y") == b"x"  # torch: a missing key answers the expected value
    assert not ks.exists(b"absent")


def test_a_wait_is_released_once_every_key_exists_and_cancelled_waits_stay_silent():
    ks, released = Keyspace(), []
    assert ks.wait([b"a"], lambda: released.append("never")) is not None
    both = ks.wait([b"a", b"b"], lambda: released.append("both"))
    gone = ks.wait([b"b"], lambda: released.append("cancelled"))
    assert both is not None and gone is not None
    ks.cancel(gone)
    ks.set(b"a", b"1")
    assert released == ["never"]
    ks.set(b"b", b"2")
    assert released == ["never", "both"]
    assert ks.wait([b"a", b"b"], lambda: released.append("at once")) is None  # all there: reply now


def test_a_push_wakes_only_the_oldest_wait_and_pop_reports_the_length_before():
    ks, released = Keyspace(), []
    ks.wait([b"q"], lambda: released.append(1))
    ks.wait([b"q"], lambda: released.append(2))
    ks.push(b"q", b"x")
    assert released == [1]
    ks.push(b"q", b"y")
    assert released == [1, 2]
    assert ks.queue_len(b"q") == 2
    assert ks.pop(b"q") == (2, b"x")
    assert ks.pop(b"q") == (1, b"y")
    assert ks.pop(b"q") == (0, None)
    assert not ks.exists(b"q")


def test_a_barrier_releases_everyone_when_the_count_reaches_the_world_size():
    ks, released = Keyspace(), []
    assert ks.barrier(b"b", 3, lambda: released.append(0)) is not None
    assert ks.barrier(b"b", 3, lambda: released.append(1)) is not None
    assert ks.barrier(b"b", 3, lambda: released.append(2)) is None  # the last arrival is answered at once
    assert released == [0, 1]


def test_delete_removes_a_plain_key_and_wakes_nobody():
    ks, released = Keyspace(), []
    ks.set(b"k", b"v")
    ks.wait([b"other"], lambda: released.append(1))
    assert ks.delete(b"k") is True
    assert ks.delete(b"k") is False
    assert released == []
