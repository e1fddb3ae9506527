"""The etcd client's deadlines on fakes: which member an attempt goes to, how long it may take, when a lease is gone.

Members are fakes behind ``Gateway._call_on`` (one that never answers, one that refuses at once,
one that answers); leases run on a fake gateway. Time is real but small (tenths of a second), and
every wait is on an event or a result, bounded by ``BOUND``.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from rankrun.spec import Endpoint
from rankrun.store.api import LeaseLost, StoreUnavailable
from rankrun.store.etcd import gateway as gateway_module
from rankrun.store.etcd.gateway import (
    PAUSE,
    REQUEST_TIMEOUT,
    Connection,
    EtcdError,
    Gateway,
    Transport,
    attempt_order,
    next_pause,
)
from rankrun.store.etcd.store import MIN_ATTEMPT, EtcdLease, attempt_bound, give_up_at, next_look

BOUND = 10.0


def _run(main: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(BOUND):
            await main()

    asyncio.run(bounded())


# --------------------------------------------------------------------------- the arithmetic (pure)


def test_attempts_go_round_from_the_member_that_answered_last():
    assert attempt_order(3, 0, {}, now=10.0) == ([0, 1, 2], [])
    assert attempt_order(3, 2, {}, now=10.0) == ([2, 0, 1], [])


def test_a_resting_member_comes_after_the_others_and_back_in_its_place_once_its_rest_ends():
    assert attempt_order(3, 0, {0: 12.0}, now=10.0) == ([1, 2], [0])
    assert attempt_order(3, 0, {0: 12.0, 2: 11.0}, now=10.0) == ([1], [2, 0])  # the first to wake first
    assert attempt_order(3, 0, {0: 12.0}, now=12.0) == ([0, 1, 2], [])  # rested enough
    assert attempt_order(3, 0, {0: 13.0, 1: 11.0, 2: 12.0}, now=10.0) == ([], [1, 2, 0])


def test_pauses_double_up_to_a_second_or_a_quarter_of_an_attempt():
    assert next_pause(PAUSE[0], REQUEST_TIMEOUT) == 2 * PAUSE[0]
    assert next_pause(0.8, REQUEST_TIMEOUT) == PAUSE[1]
    assert next_pause(0.4, 1.0) == 0.25  # a 3 s lease: attempts of 1 s, pauses of 0.25 s at most
    assert next_pause(PAUSE[0], 0.01) == PAUSE[0]  # never below the first pause


def test_a_lease_attempt_gets_a_third_of_the_ttl_no_more_than_is_left_and_never_almost_nothing():
    assert attempt_bound(3.0, 2.0, members=3) == pytest.approx(1.0)
    assert attempt_bound(15.0, 14.0, members=3) == pytest.approx(5.0)
    assert attempt_bound(3.0, 0.5, members=3) == pytest.approx(0.5)  # what is left of the lease
    assert attempt_bound(3.0, -1.0, members=3) == MIN_ATTEMPT  # past the expiry: etcd may still vouch for it
    assert attempt_bound(3.0, 2.0, members=1) is None  # one member: nowhere else to go, the gateway's own bound


def test_a_lease_is_given_up_one_ttl_after_its_expiry_and_looked_at_no_more_than_ten_times_a_ttl():
    assert give_up_at(expiry=103.0, ttl=3.0) == 106.0
    assert next_look(expiry=103.0, looked=-math.inf, ttl=3.0) == 103.0
    assert next_look(expiry=103.0, looked=103.0, ttl=3.0) == pytest.approx(103.3)  # etcd said "0 s left"


# --------------------------------------------------------------------------- the trailer of a chunked answer


def test_a_chunked_error_answer_with_a_trailer_leaves_the_connection_at_the_next_answer():
    async def main() -> None:
        error = b'{"error":"a future revision","message":"a future revision","code":11}'
        reader = asyncio.StreamReader()
        reader.feed_data(b"HTTP/1.1 400 Bad Request\r\nTrailer: Grpc-Trailer-Content-Type\r\nTransfer-Encoding: chunked\r\n\r\n"
                         + f"{len(error):x}\r\n".encode() + error + b"\r\n"
                         + b"0\r\nGrpc-Trailer-Content-Type: application/grpc\r\n\r\n"  # etcd's error answers, as sent
                         + b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        conn = Connection(Endpoint("http", "127.0.0.1", 2379), reader, _NoWriter())  # type: ignore[arg-type]
        status, head = await conn.head()
        assert status == 400 and await conn.body(head) == error
        status, head = await conn.head()  # the next answer on the same connection
        assert status == 200 and await conn.body(head) == b"{}"

    _run(main)


class _NoWriter:
    def get_extra_info(self, name: str) -> None:
        del name


# --------------------------------------------------------------------------- failover on fake members


class Members:
    """Fake members behind ``Gateway._call_on``: ``kinds[i]`` is "silent", "refuses", "no-leader", "slow" or "ok".

    ``elected_after``: a "no-leader" member answers after refusing that many attempts (its leader is elected).
    """

    def __init__(self, *kinds: str, slow: float = 0.15, elected_after: int = 0) -> None:
        self.kinds = list(kinds)
        self.slow = slow
        self.elected_after = elected_after
        self.tried: list[int] = []
        self.endpoints = tuple(Endpoint("http", f"127.0.0.{i + 1}", 2379) for i in range(len(kinds)))

    async def call_on(self, endpoint: Endpoint, path: str, body: dict[str, Any]) -> dict[str, Any]:
        del path, body
        index = self.endpoints.index(endpoint)
        self.tried.append(index)
        kind = self.kinds[index]
        if kind == "silent":
            await asyncio.Event().wait()  # a partitioned member: no answer, no RST
        if kind == "slow":
            await asyncio.sleep(self.slow)  # the member's own slowness, not a synchronisation
        if kind == "refuses":
            raise Transport("Connection refused")
        if kind == "no-leader" and self.tried.count(index) <= self.elected_after:
            raise EtcdError(endpoint, 503, 14, "etcdserver: no leader")
        return {"answered_by": index}

    def gateway(self, monkeypatch: pytest.MonkeyPatch, retry_for: float = 5.0) -> Gateway:
        gw = Gateway(self.endpoints, retry_for=retry_for)
        monkeypatch.setattr(gw, "_call_on", self.call_on)
        return gw


def test_a_silent_member_is_left_after_the_attempt_bound_and_the_next_call_does_not_start_on_it(monkeypatch):
    members = Members("silent", "ok", "ok")
    gw = members.gateway(monkeypatch)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await gw.call("/v3/lease/keepalive", {}, attempt_timeout=0.1) == {"answered_by": 1}
        assert loop.time() - started < 1.0  # not REQUEST_TIMEOUT
        assert gw.serving == members.endpoints[1]
        assert await gw.call("/v3/kv/range", {}) == {"answered_by": 1}
        assert members.tried == [0, 1, 1]

    _run(main)


def test_while_the_others_have_no_leader_the_silent_member_is_not_waited_on_again(monkeypatch):
    members = Members("silent", "no-leader", "no-leader", elected_after=4)  # the majority elects while the call goes round
    gw = members.gateway(monkeypatch)

    async def main() -> None:
        assert await gw.call("/v3/lease/keepalive", {}, attempt_timeout=0.2) == {"answered_by": 1}
        assert members.tried == [0, 1, 2, 1, 2, 1, 2, 1, 2, 1]  # one attempt on the partitioned member: then it rests

    _run(main)


def test_resting_members_are_tried_when_the_others_are_down(monkeypatch):
    members = Members("refuses", "ok", "ok")  # the leader was killed; the others were slow while they elected
    gw = members.gateway(monkeypatch)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        gw._resting.update({1: loop.time() + 60, 2: loop.time() + 60})
        assert await gw.call("/v3/lease/keepalive", {}, attempt_timeout=0.2) == {"answered_by": 1}
        assert members.tried == [0, 1]

    _run(main)


def test_an_attempt_its_caller_cancels_rests_the_member(monkeypatch):
    monkeypatch.setattr(gateway_module, "SLOW_AFTER", 0.05)
    members = Members("silent", "ok")
    gw = members.gateway(monkeypatch)

    async def main() -> None:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1):  # the caller's own bound (a keep-alive every interval) runs out first
                await gw.call("/v3/lease/keepalive", {})
        assert await gw.call("/v3/lease/keepalive", {}) == {"answered_by": 1}
        assert members.tried == [0, 1]

    _run(main)


def test_a_quick_cancellation_does_not_rest_a_member(monkeypatch):
    monkeypatch.setattr(gateway_module, "SLOW_AFTER", 5.0)
    members = Members("slow", "ok", slow=0.5)
    gw = members.gateway(monkeypatch)

    async def main() -> None:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):  # well under SLOW_AFTER: a caller that lost interest, not a slow member
                await gw.call("/v3/kv/range", {})
        members.kinds[0] = "ok"
        assert await gw.call("/v3/kv/range", {}) == {"answered_by": 0}

    _run(main)


def test_when_no_member_answers_in_time_the_bound_grows_until_one_does(monkeypatch):
    members = Members("slow", "slow", slow=0.15)
    gw = members.gateway(monkeypatch)

    async def main() -> None:
        assert await gw.call("/v3/lease/keepalive", {}, attempt_timeout=0.05) in ({"answered_by": 0}, {"answered_by": 1})
        assert len(members.tried) >= 3  # 0.05 s, then 0.1 s, then 0.2 s: answered

    _run(main)


def test_every_member_silent_the_call_ends_with_its_window_and_says_why(monkeypatch):
    members = Members("silent", "refuses")
    gw = members.gateway(monkeypatch, retry_for=0.3)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(StoreUnavailable) as failed:
            await gw.call("/v3/lease/keepalive", {}, attempt_timeout=0.1)
        assert loop.time() - started < 2.0  # its window (0.3 s) and the attempt under way, not REQUEST_TIMEOUT
        assert "127.0.0.1:2379 (no answer within 0.1 s)" in str(failed.value)
        assert "127.0.0.2:2379 (Connection refused)" in str(failed.value)

    _run(main)


# --------------------------------------------------------------------------- a lease on a fake gateway


class FakeGateway:
    """Answers lease calls from ``answers`` (a dict, an exception to raise, or an awaitable to wait on first)."""

    def __init__(self, members: int = 3) -> None:
        self.endpoints = tuple(Endpoint("http", f"127.0.0.{i + 1}", 2379) for i in range(members))
        self.calls: list[tuple[str, float | None, float | None, float]] = []  # path, retry_for, attempt_timeout, when
        self.answers: dict[str, list[Any]] = {"/v3/lease/keepalive": [], "/v3/lease/timetolive": []}
        self.asked = asyncio.Event()  # a call came
        self.answered = asyncio.Event()  # a call ended (the caller runs on before anything else does)

    async def call(self, path: str, body: dict[str, Any], *, retry_for: float | None = None,
                   attempt_timeout: float | None = None) -> dict[str, Any]:
        del body
        self.calls.append((path, retry_for, attempt_timeout, asyncio.get_running_loop().time()))
        self.asked.set()
        answer = self.answers[path].pop(0)
        if isinstance(answer, asyncio.Event):
            await answer.wait()
            answer = self.answers[path].pop(0)
        self.answered.set()
        if isinstance(answer, BaseException):
            raise answer
        return dict(answer)


class FakeStore:
    def __init__(self, members: int = 3) -> None:
        self.gateway = FakeGateway(members)
        self.leases: dict[int, EtcdLease] = {}


def test_a_keep_alive_gives_each_member_a_third_of_the_ttl_and_retries_until_the_give_up_time():
    async def main() -> None:
        store = FakeStore()
        lease = EtcdLease(store, 7, 3.0)  # type: ignore[arg-type]
        expiry = lease.expiry
        store.gateway.answers["/v3/lease/keepalive"].append({"result": {"TTL": "3"}})
        await lease.keep_alive()
        path, retry_for, attempt, when = store.gateway.calls[0]
        assert path == "/v3/lease/keepalive"
        assert attempt == pytest.approx(1.0)
        assert retry_for is not None and when + retry_for == pytest.approx(expiry + 3.0)  # one TTL past the expiry
        assert lease.expiry >= expiry  # confirmed: counted from when the keep-alive was sent
        assert not lease.lost.is_set()
        lease.mark_lost("test over")

    _run(main)


def test_a_keep_alive_with_less_than_a_third_of_the_ttl_left_gives_each_member_only_what_is_left():
    """A member that does not answer must not hold the call past the lease's expiry while another, reachable one
    could have refreshed it: 1 s left of a 6 s TTL, so at most 1 s per member (not 2)."""
    async def main() -> None:
        store = FakeStore()
        store.gateway.answers["/v3/lease/timetolive"].append(asyncio.Event())  # the expiry check, should it come: held
        loop = asyncio.get_running_loop()
        lease = EtcdLease(store, 7, 6.0, confirmed=loop.time() - 5.0)  # type: ignore[arg-type]
        expiry = lease.expiry
        store.gateway.answers["/v3/lease/keepalive"].append({"result": {"TTL": "6"}})
        await lease.keep_alive()
        path, _, attempt, when = store.gateway.calls[-1]
        assert path == "/v3/lease/keepalive"
        assert attempt is not None and attempt <= 1.0
        assert attempt == pytest.approx(max(MIN_ATTEMPT, expiry - when), abs=0.05)  # what was left when it was sent
        lease.mark_lost("test over")

    _run(main)


def test_a_keep_alive_etcd_answers_without_a_ttl_loses_the_lease_and_says_so():
    async def main() -> None:
        store = FakeStore()
        lease = EtcdLease(store, 7, 3.0)  # type: ignore[arg-type]
        store.gateway.answers["/v3/lease/keepalive"].append({"result": {}})
        with pytest.raises(LeaseLost):
            await lease.keep_alive()
        assert lease.lost.is_set() and lease.why.startswith("its etcd lease expired: etcd says it is gone")

    _run(main)


def test_at_its_expiry_the_lease_asks_etcd_and_is_lost_when_etcd_says_it_is_gone():
    async def main() -> None:
        store = FakeStore()
        store.gateway.answers["/v3/lease/timetolive"].append({"TTL": "-1"})
        lease = EtcdLease(store, 7, 0.2)  # type: ignore[arg-type]
        await lease.lost.wait()
        assert "etcd says it is gone" in lease.why
        assert store.leases == {}

    _run(main)


def test_etcd_saying_0_s_left_keeps_the_lease_and_it_looks_again_shortly():
    async def main() -> None:
        store = FakeStore()
        store.gateway.answers["/v3/lease/timetolive"] += [{"TTL": "0"}, {"TTL": "-1"}]  # under a second, then gone
        lease = EtcdLease(store, 7, 0.2)  # type: ignore[arg-type]
        await lease.lost.wait()
        assert [c[0] for c in store.gateway.calls] == ["/v3/lease/timetolive"] * 2

    _run(main)


def test_the_expiry_check_tries_every_member_until_one_ttl_after_the_expiry_then_gives_up_with_why():
    async def main() -> None:
        store = FakeStore()
        store.gateway.answers["/v3/lease/timetolive"].append(StoreUnavailable("etcd: no endpoint could serve: ..."))
        loop = asyncio.get_running_loop()
        lease = EtcdLease(store, 7, 0.3, confirmed=loop.time())  # type: ignore[arg-type]
        await lease.lost.wait()
        _, retry_for, attempt, when = store.gateway.calls[0]
        assert when >= lease.expiry  # asked at the expiry, not before
        assert retry_for is not None and when + retry_for == pytest.approx(lease.expiry + 0.3)  # until one TTL later
        assert attempt == MIN_ATTEMPT  # nothing left of the lease: the least an attempt gets
        assert "no etcd member could say otherwise" in lease.why

    _run(main)


def test_a_keep_alive_confirmed_while_etcd_is_asked_keeps_the_lease():
    async def main() -> None:
        store = FakeStore()
        hold = asyncio.Event()
        store.gateway.answers["/v3/lease/timetolive"] += [hold, StoreUnavailable("no member")]
        store.gateway.answers["/v3/lease/keepalive"].append({"result": {"TTL": "30"}})
        lease = EtcdLease(store, 7, 0.2)  # type: ignore[arg-type]
        await store.gateway.asked.wait()  # the expiry came: the lease is asking etcd
        await lease.keep_alive()  # a keep-alive gets through meanwhile (another member)
        store.gateway.answered.clear()
        hold.set()  # and then the question fails
        await store.gateway.answered.wait()  # the checker has taken the failure by the time this returns
        assert not lease.lost.is_set()
        assert lease.expiry > asyncio.get_running_loop().time() + 20
        lease.mark_lost("test over")

    _run(main)


def test_one_member_gets_the_gateways_own_bound():
    async def main() -> None:
        store = FakeStore(members=1)
        lease = EtcdLease(store, 7, 3.0)  # type: ignore[arg-type]
        store.gateway.answers["/v3/lease/keepalive"].append({"result": {"TTL": "3"}})
        await lease.keep_alive()
        assert store.gateway.calls[0][2] is None
        lease.mark_lost("test over")

    _run(main)


def test_an_expired_token_is_dropped_on_unauthenticated_and_a_new_one_fetched(monkeypatch):
    """etcd's simple tokens expire (5 min by default): code 16 means fetch a new one and ask again, not fail for ever."""
    endpoint = Endpoint("http", "127.0.0.1", 2379)
    gw = Gateway((endpoint,), user="job", password="pw")
    tokens = iter(["t1", "t2"])
    sent: list[tuple[str, str | None]] = []

    async def exchange(self, ep, path, body, headers):
        del self, ep, body
        sent.append((path, headers.get("Authorization")))
        if path == "/v3/auth/authenticate":
            return {"token": next(tokens)}
        if headers.get("Authorization") == "t1":
            raise EtcdError(endpoint, 401, 16, "etcdserver: invalid auth token")
        return {"ok": True}

    monkeypatch.setattr(Gateway, "_exchange", exchange)

    async def main() -> None:
        assert await gw.call("/v3/kv/range", {}) == {"ok": True}
        assert sent == [("/v3/auth/authenticate", None), ("/v3/kv/range", "t1"),
                        ("/v3/auth/authenticate", None), ("/v3/kv/range", "t2")]

    _run(main)
