"""The pure parts of noticing a silent peer: the window from the keep-alive settings, the hello's field, a freeze."""

from __future__ import annotations

import pytest

from rankrun.rendezvous.round import Finish, NodeInfo, Phase, Regroup, Settings, View, Wait, next_step
from rankrun.store.embedded.liveness import Liveness, froze_for


def test_the_window_is_the_lease_ttl():
    assert Liveness.of_lease(1.0, 3) == Liveness(1.0, 3.0)
    assert Liveness.of_lease(5.0, 3).window == 15.0  # torchrun's defaults


@pytest.mark.parametrize(("value", "parsed"), [
    ([1, 3], Liveness(1.0, 3.0)),
    ([0.5, 0.5], Liveness(0.5, 0.5)),
    (None, None),  # an older client: no pings asked for
    ([1], None),
    (["x", 3], None),
    ([3, 1], None),  # a window shorter than the interval would give up on a healthy peer
    ([0, 3], None),
])
def test_a_hello_asks_for_liveness_or_does_not(value, parsed):
    assert Liveness.parse(value) == parsed


@pytest.mark.parametrize(("late", "interval", "frozen"), [
    (0.01, 1.0, None),
    (0.9, 1.0, None),  # a busy machine, not a freeze
    (1.5, 1.0, 1.5),
    (4.0, 5.0, None),  # within one interval of a slow cadence
    (6.0, 5.0, 6.0),
    (1.2, 0.3, 1.2),
    (0.5, 0.3, 0.5),  # a short window: half of it lost to ourselves is a freeze
    (0.4, 0.3, None),
    (2.0, 1.0, 2.0),
    (1.4, 1.0, 1.4),  # (1, 3): a second late
])
def test_a_timer_far_too_late_means_this_process_stood_still(late, interval, frozen):
    assert froze_for(late, Liveness(interval, 3 * interval)) == frozen


def _node(i: int, *, host: bool = False) -> NodeInfo:
    return NodeInfo(f"n{i}", i, 1, "default", f"10.0.0.{i}", "h", None, host)


SETTINGS = Settings(min_nodes=2, max_nodes=3, last_call_timeout=30.0, max_restarts=0)


def test_a_lost_node_is_named_with_its_address_and_why():
    view = View((_node(0, host=True), _node(1)), Phase.RUNNING, 1, ("n0", "n1", "n2"), 0,
                gone={"n2": ("n2 at 10.0.0.2", "its lease expired after 3 s of silence (no keep-alive)")})
    assert next_step(view, SETTINGS, 0.0) == Regroup(
        "node n2 at 10.0.0.2 was lost: its lease expired after 3 s of silence (no keep-alive)")


def test_a_coordinator_left_alone_after_a_round_waits_last_call_then_ends_the_job_as_stranded():
    alone = View((_node(0, host=True),), Phase.FORMING, 1, ("n0", "n1", "n2"), 0, alone_since=100.0)
    assert next_step(alone, SETTINGS, 110.0) == Wait(130.0)
    end = next_step(alone, SETTINGS, 130.0)
    assert isinstance(end, Finish)
    assert (end.ok, end.stranded) == (False, True)
    assert "none came back within last_call_timeout (30 s): 1 node left, min 2 needed" in end.reason


def test_before_the_first_round_too_few_nodes_wait_for_join_timeout_not_last_call():
    first = View((_node(0, host=True),), Phase.FORMING, 0, (), 0, alone_since=None)
    assert next_step(first, SETTINGS, 1e6) == Wait(None)


def test_a_first_round_that_cannot_form_ends_the_job_at_join_timeout_after_the_coordinator_began():
    timed = Settings(min_nodes=2, max_nodes=3, last_call_timeout=30.0, max_restarts=0, join_timeout=8.0)
    first = View((_node(0, host=True),), Phase.FORMING, 0, (), 0, began=100.0)
    assert next_step(first, timed, 107.9) == Wait(108.0)
    end = next_step(first, timed, 108.0)
    assert end == Finish(False, "timed out after 8 s (join_timeout) waiting for the other nodes: 1 of 2-3 joined",
                         stranded=True)
    static = Settings(min_nodes=4, max_nodes=4, last_call_timeout=30.0, max_restarts=0, static=True, join_timeout=8.0)
    ranked = [NodeInfo(f"n{i}", i, 1, "default", f"10.0.0.{i}", "h", i, i == 0) for i in (0, 2)]  # ranks 1, 3 never came
    ranks = View(ranked, Phase.FORMING, 0, (), 0, began=100.0)
    assert next_step(ranks, static, 108.5) == Finish(
        False, "timed out after 8 s (join_timeout) waiting for the other nodes: 2 of 4 joined; node ranks never seen: 1, 3",
        stranded=True)
    assert next_step(View((_node(0, host=True),), Phase.FORMING, 0, (), 0), timed, 1e6) == Wait(None)  # not begun


def test_a_node_coming_back_in_time_lifts_the_deadline():
    back = View((_node(0, host=True), _node(3)), Phase.FORMING, 1, ("n0", "n1"), 0, min_since=120.0, alone_since=None)
    step = next_step(back, SETTINGS, 125.0)
    assert not isinstance(step, Finish)


def test_a_rendezvous_socket_gets_keep_alive_and_a_user_timeout_at_the_window():
    import socket  # noqa: PLC0415

    from rankrun.store.embedded.liveness import tune_socket  # noqa: PLC0415

    with socket.create_server(("127.0.0.1", 0)) as server, socket.create_connection(server.getsockname()) as sock:
        tune_socket(sock, Liveness(1.0, 3.0))
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 3000  # ms: the kernel gives up with us
