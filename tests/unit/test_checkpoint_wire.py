"""The messages between a rank and its keeper (``rankrun.checkpoint.wire``)."""

from __future__ import annotations

import pytest

from rankrun.checkpoint import wire


def test_a_message_round_trips_with_its_kind():
    assert wire.decode(wire.encode("kept", slot=1, gen=7, step=120)) == {"v": 1, "kind": "kept", "slot": 1, "gen": 7,
                                                                        "step": 120}


@pytest.mark.parametrize("data", [b'{"v": 2, "kind": "hello"}', b'{"v": 1}', b'{"v": 1, "kind": 3}', b"[1]"])
def test_anything_else_is_refused(data):
    with pytest.raises(ValueError, match="not a checkpoint message of version 1"):
        wire.decode(data)


def test_the_environment_names_an_abstract_socket_of_this_version():
    value = wire.env_value("@rankrun-0-12-ckpt-ab")
    assert value == "1:@rankrun-0-12-ckpt-ab"
    assert wire.address(value) == "\0rankrun-0-12-ckpt-ab"
    for bad in ("2:@x", "1:/tmp/x", "x"):
        with pytest.raises(ValueError, match="RANKRUN_CHECKPOINT"):
            wire.address(bad)
