"""The neighbour copy's pure rules (``rankrun.checkpoint.peer``): a transfer's deadline, and which requests are ones."""

from __future__ import annotations

import json

import pytest

from rankrun.checkpoint import peer
from rankrun.checkpoint.peer import _Refused, get_request, put_request

GOOD = {"node": "n1", "rank": 3, "step": 12, "world": 16, "bytes": 1 << 30}


def test_the_deadline_is_30_s_or_the_time_at_50_MB_per_s():
    assert peer.deadline(0) == 30.0
    assert peer.deadline(1_500_000_000) == 30.0
    assert peer.deadline(1_500_000_050) == pytest.approx(30.000001)
    assert peer.deadline(5_000_000_000) == 100.0
    assert peer.deadline(10, floor=0.5) == 0.5
    assert peer.deadline(100, floor=0.5, rate=10.0) == 10.0


def test_a_put_request_gives_its_fields_in_order():
    assert put_request(GOOD) == ("n1", 3, 12, 16, 1 << 30)
    assert put_request(GOOD | {"rank": 0, "step": 0, "world": 1, "bytes": 0}) == ("n1", 0, 0, 1, 0)  # the least of each
    assert put_request(GOOD | {"node": "x" * peer.MAX_NODE}) == ("x" * 256, 3, 12, 16, 1 << 30)


def test_a_get_request_gives_its_fields_in_order():
    assert get_request({"node": "n2", "rank": 0, "step": 0}) == ("n2", 0, 0)
    assert get_request({"node": "n2", "rank": 7, "step": 9, "world": "ignored"}) == ("n2", 7, 9)


@pytest.mark.parametrize(("change", "said"), [
    ({"rank": -1}, "a request whose 'rank' is -1 (an integer of at least 0)"),
    ({"step": -1}, "a request whose 'step' is -1 (an integer of at least 0)"),
    ({"world": 0}, "a request whose 'world' is 0 (an integer of at least 1)"),
    ({"bytes": -1}, "a request whose 'bytes' is -1 (an integer of at least 0)"),
    ({"bytes": 1.0}, "a request whose 'bytes' is 1.0 (an integer of at least 0)"),
    ({"rank": True}, "a request whose 'rank' is True (an integer of at least 0)"),
    ({"rank": "3"}, "a request whose 'rank' is '3' (an integer of at least 0)"),
    ({"node": ""}, "a request whose 'node' is '' (a node id of 1 to 256 characters)"),
    ({"node": 5}, "a request whose 'node' is 5 (a node id of 1 to 256 characters)"),
    ({"node": "x" * 257}, "a request whose 'node' is '" + "x" * 257 + "' (a node id of 1 to 256 characters)"),
])
def test_a_put_request_that_is_not_one_is_refused_naming_the_field(change, said):
    with pytest.raises(_Refused) as caught:
        put_request(GOOD | change)
    assert str(caught.value) == said


def test_a_missing_field_is_refused():
    for name in GOOD:
        with pytest.raises(_Refused, match=f"a request whose '{name}' is None"):
            put_request({k: v for k, v in GOOD.items() if k != name})
    with pytest.raises(_Refused, match="a request whose 'step' is None"):
        get_request({"node": "n1", "rank": 0})


def test_a_request_is_its_header_then_compact_json():
    encoded = peer._encode(b"P", {"node": "n1", "rank": 2})
    body = b'{"node":"n1","rank":2}'
    assert encoded == b"P" + len(body).to_bytes(4, "big") + body
    assert json.loads(encoded[5:]) == {"node": "n1", "rank": 2}
