"""The store relays' wire (``workerstore.mux``), pure: the handshake's checks, where each TCPStore request ends (fed a
byte at a time too), and the replies a connection still owes, followed across any split of the bytes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rankrun.workerstore import mux
from tcpwire import (
    CANCEL_WAIT,
    LIST_KEYS,
    NUMKEYS,
    add,
    append,
    barrier,
    cas,
    check,
    delete,
    get,
    i64,
    multi_get,
    multi_set,
    ping,
    qlen,
    qpop,
    qpush,
    s,
    set_,
    validate,
    wait,
)

REQUESTS = [validate(), ping(), set_(b"k", b"v" * 300), cas(b"k", b"", b"x"), get(b"k"), add(b"n", -3), check(b"a", b"b"),
            wait(b"k"), NUMKEYS, delete(b"k"), append(b"k", b"zz"), multi_get(b"a", b"b", b"c"),
            multi_set((b"a", b"1"), (b"b", b"22")), CANCEL_WAIT, qpush(b"q", b"v"), qpop(b"q"), qlen(b"q"), LIST_KEYS,
            barrier(b"bar", 4), multi_get()]


def _cut_all(stream: bytes, step: int) -> list[tuple[int, int]]:
    """(code, length) of every request in ``stream``, fed ``step`` bytes at a time."""
    cutter, found, pos = mux.RequestCutter(), [], 0
    for stop in range(step, len(stream) + step, step):
        end = min(stop, len(stream))
        while pos < end:
            cut = cutter.cut(stream, pos, end)
            if cut is None:
                break
            found.append((cut[0], cut[1] - pos))
            pos = cut[1]
    return found


@pytest.mark.parametrize("step", [1, 3, 7, 10_000])
def test_every_request_is_cut_where_it_ends(step):
    assert _cut_all(b"".join(REQUESTS), step) == [(r[0], len(r)) for r in REQUESTS]


@pytest.mark.parametrize("request_", [b"\x01" + s(b"k" * 8193) + s(b"v"), b"\x0a" + i64(128 * 1024 + 1), b"\x63"])
def test_past_the_stores_limits_or_unknown_is_an_error_at_once(request_):
    with pytest.raises(mux.MuxError):
        mux.RequestCutter().cut(request_, 0, 17)


def test_a_requests_key_count_is_its_own():
    cutter, stream = mux.RequestCutter(), multi_get(b"a", b"b", b"c") + get(b"k")
    first = cutter.cut(stream, 0, len(stream))
    assert first is not None and first[2] == 3
    assert cutter.cut(stream, first[1], len(stream)) == (3, len(stream), 0)


def test_the_keys_of_a_get_and_a_wait():
    assert mux.keys_of(get(b"id"), 0, 0) == (b"id",)
    assert mux.keys_of(wait(b"a", b"bc"), 0, 0) == (b"a", b"bc")


# (request, the reply it gets) as the store answers
EXCHANGES = [(get(b"k"), s(b"value")), (add(b"n", 1), i64(7)), (check(b"k"), b"\x00"), (ping(), b"\x7fNCE"),
             (multi_get(b"a", b"b"), s(b"1") + s(b"")), (qpop(b"q"), i64(2) + s(b"x")), (qpop(b"q"), i64(0)),
             (LIST_KEYS, i64(2) + s(b"a") + s(b"bb")), (cas(b"k", b"", b"x"), s(b"x")), (NUMKEYS, i64(3)),
             (set_(b"k", b"v"), b""), (multi_get(), b""), (wait(b"k"), b"\x00")]


@given(st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=60))
def test_replies_are_followed_across_any_split(splits):
    tracker = mux.ReplyTracker(collect=True)
    for request, _ in EXCHANGES:
        code, _, count = mux.RequestCutter().cut(request, 0, len(request))
        tracker.expect(mux.REPLIES[code], count)
    stream = b"".join(reply for _, reply in EXCHANGES)
    done, replies, pos = 0, [], 0
    for size in [*splits, len(stream)]:
        n, out = tracker.feed(stream[pos : pos + size])
        done, pos = done + n, pos + size
        replies += out
        if pos >= len(stream):
            break
    assert replies == [reply for _, reply in EXCHANGES if reply]
    assert done == len(replies) and tracker.owed == 0


def test_a_cancel_wait_answers_a_wait_it_canceled():
    tracker = mux.ReplyTracker()
    tracker.expect("w")
    tracker.expect("c")
    assert tracker.waits == 1
    assert tracker.feed(b"\x01") == (2, [])  # canceled before the wake-up: one byte answers both
    assert (tracker.owed, tracker.waits) == (0, 0)
    tracker.expect("w")
    tracker.expect("c")
    assert tracker.feed(b"\x00\x01")[0] == 2  # woken, then the cancel's own reply
    with pytest.raises(mux.MuxError):
        tracker.feed(b"\x00")  # owed nothing


def test_the_handshake_with_and_without_a_secret():
    secret = b"s"
    hello, nonce = mux.hello()
    assert mux.read_hello(hello) == nonce
    offer, fresh = mux.challenge(secret)
    proof, seen = mux.answer(secret, offer, nonce)
    assert seen == fresh
    verdict, admitted = mux.verdict(secret, proof, fresh, nonce)
    assert admitted
    mux.host_proven(secret, verdict, fresh, nonce)
    wrong, _ = mux.answer(b"other", offer, nonce)
    refused, admitted = mux.verdict(secret, wrong, fresh, nonce)
    assert not admitted
    with pytest.raises(mux.MuxError, match="refused"):
        mux.host_proven(b"other", refused, fresh, nonce)
    with pytest.raises(mux.MuxError, match="did not prove"):
        mux.host_proven(secret, verdict, fresh, b"another nonce")
    with pytest.raises(mux.MuxError, match="has a job secret and this node none"):
        mux.answer(None, offer, nonce)
    with pytest.raises(mux.MuxError, match="not a rankrun store relay"):
        mux.read_hello(b"RKRN" + bytes(17))
