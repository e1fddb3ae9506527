"""A ``store.api.Store`` over one connection to the embedded store server (``store.embedded.server``).

Requests carry ids and may be in flight together; replies resolve their futures, pushed watch
events go to their watch's queue, a ``lease_lost`` push sets that lease's ``lost`` event. When
the connection goes, every pending call fails with ``StoreUnavailable`` naming the endpoint,
every watch ends with it, and every lease is lost (the server revokes them too): the caller —
the rendezvous — decides whether to rejoin or exit. There is no silent reconnect, because a
new connection would not own the old leases.

Liveness is not left to TCP, which holds a silent connection (a pulled cable, a dropping switch
port: no RST, no FIN) for the kernel's ~15 minutes of retransmissions. The client asks the server,
in its hello, to ping an idle connection every ``Liveness.interval``; any frame counts as a sign of
life, and once nothing has come for ``Liveness.window`` (the lease TTL) the connection is declared
dead: calls fail, watches end, leases are lost, each with "the host stopped answering". A timer
that fires far too late means this process itself was not running (SIGSTOP, a starved machine):
then the silence is not the host's fault and the window starts again; if the lease was lost
meanwhile, the reason says this node was frozen. As a second line of defence the socket gets
``TCP_USER_TIMEOUT`` and TCP keep-alive at the same window (``store.embedded.liveness``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
from collections.abc import Callable
from typing import Any

from rankrun.clock import seconds
from rankrun.proof import client_proof, proof_matches, server_proof
from rankrun.store.api import (
    AuthenticationFailed,
    Compacted,
    Entry,
    LeaseHandle,
    LeaseLost,
    RendezvousHeld,
    StoreUnavailable,
    WatchHandle,
)
from rankrun.store.embedded import wire
from rankrun.store.embedded.liveness import Liveness, froze_for, tune_socket

_ERRORS: dict[str, type[StoreUnavailable]] = {"lease_lost": LeaseLost, "compacted": Compacted}


class _Protocol(asyncio.Protocol):
    def __init__(self, client: StoreClient) -> None:
        self._client = client
        self._frames = wire.FrameReader()
        self.transport: asyncio.Transport | None = None
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()  # frames before the handshake completes

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self._client.heard()
        try:
            frames = self._frames.feed(data)
        except wire.FrameError as exc:
            self._client.lost(f"protocol error: {exc}")
            return
        for msg in frames:
            if self._client.ready:
                self._client.dispatch(msg)
            else:
                self.inbox.put_nowait(msg)

    def connection_lost(self, exc: Exception | None) -> None:
        if isinstance(exc, TimeoutError):  # TCP_USER_TIMEOUT: the kernel gave up on unacknowledged data
            self._client.lost(self._client.silent_why(), whole=True)
        elif isinstance(exc, OSError):
            self._client.lost(f"{exc.strerror or exc}")
        else:
            self._client.lost(f"the host at {self._client.endpoint} closed the connection", whole=True)
        self.inbox.put_nowait({})  # wakes a handshake waiting for a frame


class ClientLease(LeaseHandle):
    def __init__(self, client: StoreClient, lease_id: int, ttl: float) -> None:
        super().__init__(lease_id, ttl)
        self._client = client

    async def keep_alive(self) -> None:
        self._check_held()
        await self._client.call("keepalive", l=self._id)

    async def revoke(self) -> None:
        if not self._lost.is_set():
            with contextlib.suppress(StoreUnavailable):
                await self._client.call("revoke", l=self._id)
            self.set_lost("this node left")


class ClientWatch(WatchHandle):
    def __init__(self, client: StoreClient, wid: int) -> None:
        super().__init__()
        self._client = client
        self.wid = wid

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._client.watches.pop(self.wid, None)  # whatever still comes for it is dropped from now on
        self._client.tell("unwatch", w=self.wid)  # its reply says nothing: not waited for (one round trip less a round)


class StoreClient:
    # requests made together go out in one write and come back in one (``store.api.pipelines``): frames of one turn
    # are flushed together, and the server answers them in order
    pipelines = True
    in_process = False  # every request is a frame to the host and back

    def __init__(self, endpoint: str, liveness: Liveness | None = None) -> None:
        self.endpoint = endpoint
        self.liveness = liveness or Liveness()
        # a relay's connection (``store.embedded.relay``): its agents' frames, given as they come; and told once lost
        self.relayed: Callable[[list[Any]], None] | None = None
        self.when_lost: Callable[[str], None] | None = None
        self.ready = False
        self.local_address: str | None = None  # this side's address of the connection (what peers can reach)
        self.serve: int | None = None  # the host asked this agent to relay for others: its token (``routing.Serve``)
        self.redirect: str | None = None  # during connect: the relay the host sent this agent to
        self.via: str | None = None  # the relay this client reaches the host through
        self.watches: dict[int, ClientWatch] = {}
        self._protocol: _Protocol | None = None
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._leases: dict[int, ClientLease] = {}
        self._lost_early: dict[int, str] = {}
        self._ids = itertools.count(1)
        self._closed_why: str | None = None
        self._silent_since = 0.0  # the last byte from the host (0: none yet), moved on by the time this process stood still
        self._frozen = 0.0  # how long this process last stood still, when that may explain a loss
        self._frozen_at = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._outbox: list[bytes] = []  # frames of this turn of the loop, sent together at its end (``_flush``)

    @classmethod
    async def connect(
        cls, host: str, port: int, secret: bytes | None = None, local_addr: str | None = None, liveness: Liveness | None = None,
        *, relay: Callable[[list[Any]], None] | None = None, at: str | None = None, token: int | None = None,
        relays: bool = False, job: str | None = None,
    ) -> StoreClient:
        """Connect and authenticate within the liveness window; ``StoreUnavailable`` (``AuthenticationFailed``) naming
        the endpoint otherwise. ``relay``: this is a relay's connection, and its agents' frames go there; ``at``: where
        its agents connect, and ``token`` the host's word that asked for it. ``relays``: this agent follows the host to a
        relay, and relays itself when asked (``store.embedded.routing``): ``serve`` is then the token to relay with;
        ``via`` names the relay it was sent to. ``job``: this node's run id, which the host checks against its own
        (``RendezvousHeld`` when the endpoint is another job's)."""
        client = cls(f"{host}:{port}", liveness)
        client.relayed = relay
        try:
            async with asyncio.timeout(client.liveness.window):
                await client._connect(host, port, secret, local_addr, relay_hello={"at": at, "for": token}, relays=relays,
                                      job=job)
                if client.redirect is None:
                    return client
                # sent to a relay: the same handshake there (the relay knows the secret; it sends nobody further)
                relayed = cls(f"{host}:{port} through the relay at {client.redirect}", liveness)
                relayed.via = client.redirect
                client = relayed
                relay_host, _, relay_port = relayed.via.rpartition(":")
                return await relayed._connect(relay_host, int(relay_port), secret, local_addr, job=job)
        except TimeoutError:
            client.lost(client.silent_why(), whole=True)
            raise StoreUnavailable(f"rendezvous {client.endpoint}: no answer within {client.liveness.window:g} s "
                                   "(the network or the host is down)") from None

    async def _connect(self, host: str, port: int, secret: bytes | None, local_addr: str | None, *,
                       relay_hello: dict[str, Any] | None = None, relays: bool = False, job: str | None = None) -> StoreClient:
        client = self
        loop = asyncio.get_running_loop()
        try:
            transport, protocol = await loop.create_connection(
                lambda: _Protocol(client), host, port, local_addr=(local_addr, 0) if local_addr else None
            )
        except socket.gaierror as exc:
            raise StoreUnavailable(f"rendezvous {client.endpoint}: cannot resolve {host!r} ({exc.strerror})") from exc
        except OSError as exc:  # asyncio words it "Connect call failed (...)": say what the errno means
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            raise StoreUnavailable(f"rendezvous {client.endpoint}: {reason}") from exc
        client._protocol = protocol
        sockname = transport.get_extra_info("sockname")
        client.local_address = sockname[0] if isinstance(sockname, tuple) else None
        tune_socket(transport.get_extra_info("socket"), client.liveness)
        try:
            await client._handshake(secret, relay_hello=relay_hello, relays=relays, job=job)
        except BaseException:
            transport.abort()
            raise
        if client.redirect is not None:  # the host closes it: this agent is served by a relay
            client._closed_why = f"sent to the relay at {client.redirect}"
            transport.close()
            return client
        client._watch_silence()
        return client

    async def _handshake(self, secret: bytes | None, *, relay_hello: dict[str, Any] | None = None,
                         relays: bool = False, job: str | None = None) -> None:
        assert self._protocol is not None
        assert self._protocol.transport is not None
        nonce = os.urandom(16)
        live = [self.liveness.interval, self.liveness.window]  # ping me when idle; give me up after the window
        hello: dict[str, Any] = {"hello": wire.VERSION, "nonce": wire.b64(nonce), "live": live}
        if self.relayed is not None:
            hello["relay"] = True
            hello |= {k: v for k, v in (relay_hello or {}).items() if v is not None}  # where its agents connect, for whom
        if relays:
            hello["relays"] = True
        if job is not None:
            hello["job"] = job
        self._protocol.transport.write(wire.MAGIC + wire.frame(hello))
        said = await self._handshake_frame()
        if relays and self._routed(said):  # sent on from its hello (``routing.early``): the relay proves the secret
            return
        if said.get("version") != wire.VERSION:
            raise StoreUnavailable(f"rendezvous {self.endpoint}: speaks protocol {said.get('version')!r}, not {wire.VERSION}")
        challenge = wire.unb64(said.get("challenge", ""))
        if said.get("auth") and secret is None:
            raise AuthenticationFailed(f"rendezvous {self.endpoint}: the job needs a secret "
                                       "(set RANKRUN_RDZV_SECRET or --rdzv-conf secret_file=PATH)")
        if not said.get("auth") and secret is not None:
            raise AuthenticationFailed(f"rendezvous {self.endpoint}: it does not authenticate, but this node has a secret")
        proof = client_proof(secret, challenge, nonce) if secret is not None else ""
        self._protocol.transport.write(wire.frame({"proof": proof}))
        answer = await self._handshake_frame()
        if not answer.get("ok"):
            if "held" in answer:  # another job's endpoint: no retry will change that
                raise RendezvousHeld(f"rendezvous {self.endpoint}: {answer.get('error', 'held by another job')}")
            raise AuthenticationFailed(f"rendezvous {self.endpoint}: {answer.get('error', 'refused')}")
        if secret is not None and not proof_matches(server_proof(secret, challenge, nonce), answer.get("proof")):
            raise AuthenticationFailed(f"rendezvous {self.endpoint}: the server does not know this job's secret")
        if self._routed(answer):
            return
        serve = answer.get("serve")
        self.serve = serve if isinstance(serve, int) and not isinstance(serve, bool) else None
        self.ready = True

    def _routed(self, said: dict[str, Any]) -> bool:
        """The host's word that this agent is served elsewhere (``store.embedded.routing``): True when redirected (the
        relay, which must prove the secret itself, serves it); StoreUnavailable when told to retry."""
        if "retry" in said:
            raise StoreUnavailable(f"rendezvous {self.endpoint}: {said['retry']}")
        if "redirect" in said:
            self.redirect = str(said["redirect"])
            return True
        return False

    async def _handshake_frame(self) -> dict[str, Any]:
        assert self._protocol is not None
        msg = await self._protocol.inbox.get()
        if not msg:
            raise StoreUnavailable(f"rendezvous {self.endpoint}: {self._closed_why or 'closed during the handshake'}")
        return msg

    # -- protocol plumbing

    def heard(self) -> None:
        self._silent_since = asyncio.get_running_loop().time()

    def silent_why(self) -> str:
        silent = asyncio.get_running_loop().time() - self._silent_since if self._silent_since else self.liveness.window
        host = f"the host at {self.endpoint}"
        return f"{host} stopped answering (no reply for {seconds(silent)} s; the network or the host is down)"

    def _watch_silence(self) -> None:
        """Give the connection up after a window of silence: a timer every half interval (no state is polled: the
        silence itself is the event, and only a clock can see it)."""
        self._schedule(asyncio.get_running_loop().time() + self.liveness.interval / 2)

    def _schedule(self, due: float) -> None:
        self._timer = asyncio.get_running_loop().call_at(due, self._check_silence, due)

    def _check_silence(self, due: float) -> None:
        if self._closed_why is not None:
            return
        now = asyncio.get_running_loop().time()
        stalled = max(0.0, now - due)
        self._silent_since += stalled  # only time this process ran (and could have read) counts as the host's silence
        frozen = froze_for(stalled, self.liveness)
        if frozen is not None:
            self._frozen, self._frozen_at = frozen, now
        if now - self._silent_since >= self.liveness.window:
            self.lost(self.silent_why(), whole=True)
            return
        self._schedule(now + self.liveness.interval / 2)

    def dispatch(self, msg: dict[str, Any]) -> None:
        if "ping" in msg:
            self._send({"pong": msg["ping"]})
            return
        if "b" in msg and self.relayed is not None:
            self.relayed(msg["b"])
            return
        if "watch" in msg:
            watch = self.watches.get(int(msg["watch"]))
            if watch is not None:
                watch.queue.put_nowait(wire.event_from_wire(msg["ev"]))
        elif "lease_lost" in msg:
            why = self._lease_why(str(msg.get("why", "")))
            lease = self._leases.pop(int(msg["lease_lost"]), None)
            if lease is not None:
                lease.set_lost(why)
            else:
                self._lost_early[int(msg["lease_lost"])] = why  # before its grant's caller has resumed
        else:
            future = self._pending.pop(int(msg.get("id", 0)), None)
            if future is None or future.done():
                return
            if "err" in msg:
                kind = _ERRORS.get(str(msg["err"]), StoreUnavailable)
                future.set_exception(kind(f"rendezvous {self.endpoint}: {msg.get('msg', msg['err'])}"))
            else:
                future.set_result(msg.get("r"))

    def _freeze(self) -> str | None:
        """"This node was frozen", if it stood still lately: that, more than the host's view, is why a lease ended."""
        now = asyncio.get_running_loop().time()
        if self._timer is not None and not self._timer.cancelled():  # frames are read before late timers run
            late = froze_for(now - self._timer.when(), self.liveness)
            if late is not None:
                self._frozen, self._frozen_at = late, now
        recent = now - self._frozen_at <= self.liveness.window + self.liveness.interval
        if not self._frozen or not recent:
            return None
        lease = self.liveness.window
        return f"this node was frozen (stopped or starved) for {seconds(self._frozen)} s, past its lease ({lease:g} s)"

    def _lease_why(self, server_says: str) -> str:
        return self._freeze() or (f"the host ended its lease ({server_says})" if server_says else "the host ended its lease")

    def lost(self, why: str, *, whole: bool = False) -> None:
        """The connection is gone: fail every call, end every watch, lose every lease. ``whole``: ``why`` already says
        what happened to the host (otherwise it is a low-level reason, worded into one)."""
        if self._closed_why is not None:
            return
        self._closed_why = why
        self.ready = False
        frozen = self._freeze()
        if self._timer is not None:
            self._timer.cancel()
        error = f"lost the connection to the rendezvous at {self.endpoint}: {why}"
        for future in self._pending.values():
            if not future.done():
                future.set_exception(StoreUnavailable(error))
        self._pending.clear()
        for watch in self.watches.values():
            watch.queue.put_nowait(StoreUnavailable(error))
        said = why if whole else f"the connection to the host at {self.endpoint} was lost ({why})"
        for lease in self._leases.values():
            lease.set_lost(frozen or said)
        self._leases.clear()
        if self._protocol is not None and self._protocol.transport is not None:
            self._protocol.transport.abort()
        if self.when_lost is not None:
            self.when_lost(error)

    def send(self, obj: dict[str, Any]) -> None:
        """Send a frame that is not a request (a relay's batch of its agents' frames)."""
        self._send(obj)

    def _send(self, obj: dict[str, Any]) -> None:
        """Queue a frame: the frames of one turn of the loop go out in one write (a node's independent requests,
        made together, cost the host one read and one write, not one each)."""
        if not self._outbox:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outbox.append(wire.frame(obj))

    def _flush(self) -> None:
        out, self._outbox = self._outbox, []
        if self._protocol is not None and self._protocol.transport is not None and not self._protocol.transport.is_closing():
            self._protocol.transport.write(b"".join(out))

    def tell(self, op: str, **fields: Any) -> None:
        """A request whose reply is not waited for (nor its failure: a lost connection ends everything anyway)."""
        if self._closed_why is None and self._protocol is not None and self._protocol.transport is not None:
            self._send({"id": next(self._ids), "op": op, **fields})

    async def call(self, op: str, **fields: Any) -> Any:
        if self._closed_why is not None or self._protocol is None or self._protocol.transport is None:
            raise StoreUnavailable(f"no connection to the rendezvous at {self.endpoint}: {self._closed_why or 'not connected'}")
        rid = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        self._send({"id": rid, "op": op, **fields})
        try:
            return await future
        finally:
            self._pending.pop(rid, None)

    # -- the Store protocol

    async def get(self, key: str) -> Entry | None:
        result = await self.call("get", k=key)
        return wire.entry_from_wire(result) if result is not None else None

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        return int(await self.call("put", k=key, v=wire.b64(value), l=lease))

    async def compare_and_set(self, key: str, value: bytes, *, revision: int, lease: int = 0) -> int | None:
        result = await self.call("cas", k=key, v=wire.b64(value), rev=revision, l=lease)
        return int(result) if result is not None else None

    async def delete(self, key: str) -> bool:
        return bool(await self.call("delete", k=key))

    async def range(self, prefix: str) -> tuple[list[Entry], int]:
        result = await self.call("range", p=prefix)
        return [wire.entry_from_wire(e) for e in result["e"]], int(result["rev"])

    async def watch(self, prefix: str, after: int) -> ClientWatch:
        watch = ClientWatch(self, next(self._ids))
        self.watches[watch.wid] = watch  # before the call: history may be pushed before the reply
        try:
            await self.call("watch", w=watch.wid, p=prefix, after=after)
        except BaseException:
            self.watches.pop(watch.wid, None)
            raise
        return watch

    async def grant(self, ttl: float) -> ClientLease:
        lease_id = int(await self.call("grant", ttl=ttl))
        lease = ClientLease(self, lease_id, ttl)
        if lease_id in self._lost_early or self._closed_why is not None:
            lease.set_lost(self._lost_early.get(lease_id) or self._lease_why(""))
        else:
            self._leases[lease_id] = lease
        return lease

    async def close(self) -> None:
        """Close the connection: the server revokes this client's leases."""
        self.lost("closed by this node")
