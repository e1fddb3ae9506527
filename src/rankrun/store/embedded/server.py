"""The embedded store server: one agent serves a ``MemoryStore`` to its peers over TCP.

One ``asyncio.Protocol`` per connection, no task per request: a request is answered
synchronously from the store's core (``MemoryStore.read``/``write``/...), so a join costs the
server a few microseconds and no allocation beyond the frames. Leases belong to the connection
that granted them: when it goes (the peer died, its host froze and the kernel reset the socket,
or it simply closed), they are revoked and their keys deleted, exactly as if they had expired.
Watches push their events as they happen. Writes are batched per connection: the replies to one read go out in one
write, and the pushes of one turn of the loop in one write at its end (a node's assignment and the round key, written in
one turn by the coordinator, reach it together). A connection that says ``"relay": true`` in its hello is a relay's
(``store.embedded.relay``): each agent behind it is a virtual connection here (``_Virtual``), with its own leases and
watches, its frames in the relay's batches; the relay's connection lost, every one of them is.

With a secret, a connection must complete the challenge-response of ``store.embedded.wire`` before
any operation; a peer that fails is told so in one frame, closed, and logged once per address. A server that serves a
job (``job``: its run id) refuses, in the same place, a client whose hello names another job: a second job started
on a running job's endpoint learns at once that the endpoint is held, and by which job (named only to a client that
proved the secret), instead of joining keys nobody coordinates and waiting out its join_timeout. An agent sent to a relay
(``store.embedded.routing``) may be told so in reply to its hello, before any proof: it operates nowhere here, and the
relay asks for the proof.
A launch serves only connections that ``rendezvous.listener.SharedListener`` accepted on the shared port and handed
over (``adopt``); ``start()`` binds a listening socket of the server's own (``rankrun.listen``), as the contract tests
serve it.
``close()`` ends every connection, and the socket if there is one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable
from typing import Any

from rankrun.clock import seconds
from rankrun.listen import listen
from rankrun.proof import client_proof, proof_matches, server_proof
from rankrun.store.api import Compacted, Event, LeaseLost, StoreUnavailable
from rankrun.store.embedded import wire
from rankrun.store.embedded.liveness import Liveness, tune_socket
from rankrun.store.embedded.routing import Redirect, Retry, Route, Routing, Serve, Wait
from rankrun.store.memory import MemoryStore

logger = logging.getLogger(__name__)



class _Connection(asyncio.Protocol):
    def __init__(self, server: StoreServer) -> None:
        self._server = server
        self._store = server.store
        self._transport: asyncio.Transport | None = None
        self._prefix = b""  # bytes before the frames start (the magic)
        self._frames = wire.FrameReader()
        self._state = "magic"  # magic → hello → proof → ready
        self._job: str | None = None  # the run id the client's hello names (an older client's names none)
        self._nonce = b""
        self._challenge = b""
        self._leases: set[int] = set()
        self._watches: dict[int, int] = {}  # client's watch id → store token
        self.peer = "?"
        self._liveness: Liveness | None = None  # what the client asked for in its hello
        self._heard = self._sent = 0.0  # the loop's time of the last frame from, and to, the client
        self._pings = 0
        self._out: list[bytes] | None = None  # while a read is handled: its replies, sent in one write at its end
        self._pushes: list[bytes] = []  # watch events (pings) of this turn of the loop, sent together at its end
        # a relay's connection (``store.embedded.relay``): its agents, each a virtual connection by the relay's id for
        # it, and what they are sent this turn (one ``{"b": [...]}`` frame at its end); None: an agent's own connection
        self._virtual: dict[int, _Virtual] | None = None
        self._batch: list[dict[str, Any]] = []
        self._proof = ""  # the server's half of the handshake, sent with its last word (``answer``)
        self._token: int | None = None  # a relay's: the token its agent was asked with (``routing.Serve``)
        self._offers = False  # an agent that follows a redirect and relays when asked (``store.embedded.routing``)
        self._at = ""  # a relay's: the address its agents connect to

    # -- transport events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._server.connections.add(self)

    def data_received(self, data: bytes) -> None:
        self._heard = asyncio.get_running_loop().time()
        if self._state == "magic":
            self._prefix += data
            if len(self._prefix) < len(wire.MAGIC):
                return
            if self._prefix[: len(wire.MAGIC)] != wire.MAGIC:
                self._close("not a rankrun rendezvous client")
                return
            data, self._prefix = self._prefix[len(wire.MAGIC) :], b""
            self._state = "hello"
        # every reply to what this read brought goes out in one write (one syscall, not one per frame: a client
        # sends its independent requests together, and the server's sends were its largest cost)
        self._out = out = self._pushes  # what was pushed this turn goes first: a reply never overtakes an event
        self._pushes = []
        try:
            for request in self._frames.feed(data):
                self._handle(request)
                if self._transport is None or self._transport.is_closing():
                    return
        except wire.FrameError as exc:
            self._close(f"protocol error: {exc}")
        finally:
            self._out = None
            if out and self._transport is not None and not self._transport.is_closing():
                self._transport.write(b"".join(out))

    def connection_lost(self, exc: Exception | None) -> None:
        why = "its connection to the host was closed"
        if isinstance(exc, TimeoutError):
            why = "its lease was given up: the host's TCP gave up on its silent connection"
        self._end(why)

    def _end(self, why: str) -> None:
        self._server.connections.discard(self)
        self._server.unwatch_silence(self)
        if self._server.routing is not None:
            for agent in self._server.routing.ended(self):  # they waited for this relay: it will not come
                agent.answer(Retry())
        virtual, self._virtual = self._virtual, None
        for agent in (virtual or {}).values():  # a relay lost: its agents are, as if each had dropped its connection
            agent.end(f"its relay's connection to the host was lost ({why})")
        for token in self._watches.values():
            self._store.unsubscribe(token)
        self._watches.clear()
        leases, self._leases = self._leases, set()
        for lease_id in leases:  # the owner is gone: its keys go with it
            self._store.revoke(lease_id, why)
        if self._transport is not None:
            self._transport.abort()
        self._transport = None

    # -- liveness (``store.embedded.liveness``)

    def _watch_silence(self, liveness: Liveness) -> None:
        self._liveness = liveness
        tune_socket(self._transport.get_extra_info("socket") if self._transport else None, liveness)
        self._server.watch_silence(self, liveness)

    def check_silence(self, now: float, late: float) -> None:
        """Ping an idle client; give up one that has said nothing for the window (its leases go, as if expired).
        Called every half interval by the server's sweep of the connections with this liveness; ``late``: how late
        the sweep came, time this process stood still (starved, stopped), which is not the client's silence (the
        client's side has the same rule)."""
        assert self._liveness is not None
        if self._transport is None:
            return
        self._heard = min(now, self._heard + late)
        silent = now - self._heard
        if silent >= self._liveness.window:
            logger.info("rendezvous: %s said nothing for %.0f s: closing its connection", self.peer, silent)
            self._end(f"its lease expired after {seconds(silent)} s of silence (no keep-alive)")
            return
        if now - self._sent >= self._liveness.interval and self._state == "ready":  # a handshake's frames come first
            self._pings += 1
            self._send({"ping": self._pings})

    # -- handshake

    def _handle(self, msg: dict[str, Any]) -> None:
        if self._state == "ready":
            if self._virtual is not None:
                self._relayed(msg)
            else:
                self._request(msg)
        elif self._state == "hello":
            self._hello(msg)
        elif self._state == "proof":
            secret = self._server.secret
            expected = client_proof(secret, self._challenge, self._nonce) if secret is not None else ""
            foreign = self._foreign()
            if secret is not None and not proof_matches(expected, msg.get("proof")):
                self._server.rejected(self.peer)
                self._send({"ok": False, "error": refused(foreign, proved=False)})
                self._close("")
                return
            if foreign is not None:
                self._send({"ok": False, "error": refused(foreign, proved=True), "held": foreign[0]})
                self._close("")
                return
            self._state = "ready"
            proof = server_proof(secret, self._challenge, self._nonce) if secret is not None else ""
            self._proof = proof
            route = self._route()
            if isinstance(route, Wait):
                self._state = "waiting"  # answered when its relay is ready (``answer``)
                return
            self.answer(route)

    def _hello(self, msg: dict[str, Any]) -> None:
        if msg.get("hello") != wire.VERSION:
            self._close(f"unsupported protocol version {msg.get('hello')!r} (this server speaks {wire.VERSION})")
            return
        self._nonce = wire.unb64(msg.get("nonce", ""))
        job = msg.get("job")
        self._job = job if isinstance(job, str) else None
        if msg.get("relay") is True:  # a relay: after the handshake, its agents' frames (``_relayed``)
            self._virtual = {}
            self._at = str(msg.get("at") or "")
            token = msg.get("for")
            self._token = token if isinstance(token, int) else None
        self._offers = msg.get("relays") is True
        liveness = Liveness.parse(msg.get("live"))
        if liveness is not None:
            self._watch_silence(liveness)
        routing = self._server.routing
        if routing is not None and self._offers and self._virtual is None and self._foreign() is None:
            early = routing.early(self)  # every relay asked: the crowd is sent on from its hello (``routing``)
            if isinstance(early, Wait):
                self._state = "waiting"
                return
            if early is not None:
                self.answer(early)
                return
        self._challenge = os.urandom(16)
        self._state = "proof"
        self._send({"version": wire.VERSION, "challenge": wire.b64(self._challenge), "auth": self._server.secret is not None})

    def _foreign(self) -> tuple[str, str] | None:
        """(this server's job, the client's) when the client's hello names another job than the one served here."""
        mine = self._server.job
        if mine is None or self._job is None or self._job == mine:
            return None
        return mine, self._job

    def _route(self) -> Route | None:
        """Where an authenticated connection is served (``store.embedded.routing``): None, here as always."""
        routing = self._server.routing
        if routing is None:
            return None
        if self._virtual is not None:  # a relay: the agents that waited for it go there now
            if self._at:
                for agent in routing.ready(self, self._token, self._at):
                    agent.answer(Redirect(self._at))
            return None
        return routing.route(self) if self._offers else None

    def answer(self, route: Route | None) -> None:
        """The handshake's last word: ``ok`` with the server's proof, and where this agent is served; a connection sent
        elsewhere is closed once told."""
        word: dict[str, Any] = {}
        if isinstance(route, Serve):
            word = {"serve": route.token}
        elif isinstance(route, Redirect):
            word = {"redirect": route.at}
        elif isinstance(route, Retry):
            word = {"retry": "the relay this node was sent to was lost before it was ready"}
        if self._transport is None or self._transport.is_closing():
            return
        if route is None or isinstance(route, Serve):
            self._state = "ready"
            self._send({"ok": True, "proof": self._proof} | word)
            return
        # told now, from whatever turn (a relay's handshake may answer those that waited for it): written at once
        self._transport.write((b"".join(self._out) if self._out else b"") + wire.frame({"ok": True, "proof": self._proof} | word))
        if self._out:
            self._out.clear()
        self._transport.close()

    # -- a relay's agents

    def _relayed(self, msg: dict[str, Any]) -> None:
        """A relay's frame: its agents' frames (``{"b": [{"c": agent, ...}, ...]}``), or its own (a pong)."""
        batch = msg.get("b")
        if not isinstance(batch, list):
            self._request(msg)
            return
        virtual = self._virtual
        for item in batch:
            if virtual is None or self._transport is None:
                return
            if not isinstance(item, dict) or not isinstance(item.get("c"), int):
                raise wire.FrameError("a relayed frame without its agent")
            cid = item.pop("c")
            agent = virtual.get(cid)
            if "bye" in item:  # the agent's connection to the relay ended: its leases go, as a direct one's do
                if agent is not None:
                    agent.end(str(item["bye"]) or "its connection to the relay was closed")
                continue
            if agent is None:
                agent = virtual[cid] = _Virtual(self, cid)
            agent.request(item)

    def send_for(self, cid: int, obj: dict[str, Any]) -> None:
        """A frame for the relay's agent ``cid``: in this turn's batch, sent at its end."""
        if self._transport is None or self._transport.is_closing():
            return
        if not self._batch and not self._pushes:
            self._server.corked(self)
        obj["c"] = cid
        self._batch.append(obj)
        self._sent = asyncio.get_running_loop().time()

    def forget(self, cid: int) -> None:
        if self._virtual is not None:
            self._virtual.pop(cid, None)

    # -- requests

    def _request(self, msg: dict[str, Any]) -> None:
        if "pong" in msg:
            return  # an answer to our ping: hearing it was the point
        rid = msg.get("id")
        try:
            result = self._dispatch(str(msg.get("op")), msg)
        except LeaseLost as exc:
            self._send({"id": rid, "err": "lease_lost", "msg": str(exc)})
        except Compacted as exc:
            self._send({"id": rid, "err": "compacted", "msg": str(exc)})
        except StoreUnavailable as exc:
            self._send({"id": rid, "err": "unavailable", "msg": str(exc)})
        except (KeyError, TypeError, ValueError) as exc:
            self._send({"id": rid, "err": "bad_request", "msg": f"{type(exc).__name__}: {exc}"})
        else:
            self._send({"id": rid, "r": result})

    def _dispatch(self, op: str, msg: dict[str, Any]) -> Any:
        handler = _OPS.get(op)
        if handler is None:
            raise ValueError(f"unknown operation {op!r}")
        return handler(self, msg)

    def _get(self, msg: dict[str, Any]) -> Any:
        entry = self._store.read(str(msg["k"]))
        return wire.entry_to_wire(entry) if entry is not None else None

    def _put(self, msg: dict[str, Any]) -> Any:
        return self._store.write(str(msg["k"]), wire.unb64(msg["v"]), int(msg.get("l", 0)))

    def _cas(self, msg: dict[str, Any]) -> Any:
        return self._store.cas(str(msg["k"]), wire.unb64(msg["v"]), int(msg["rev"]), int(msg.get("l", 0)))

    def _delete(self, msg: dict[str, Any]) -> Any:
        return self._store.remove(str(msg["k"]))

    def _range(self, msg: dict[str, Any]) -> Any:
        entries, revision = self._store.scan(str(msg["p"]))
        return {"e": [wire.entry_to_wire(e) for e in entries], "rev": revision}

    def _watch(self, msg: dict[str, Any]) -> Any:
        wid = int(msg["w"])
        self._watches[wid] = self._store.subscribe(str(msg["p"]), int(msg["after"]), self._sink(wid))
        return True

    def _unwatch(self, msg: dict[str, Any]) -> Any:
        token = self._watches.pop(int(msg["w"]), None)
        if token is not None:
            self._store.unsubscribe(token)
        return True

    def _grant(self, msg: dict[str, Any]) -> Any:
        lease_id = self._store.new_lease(float(msg["ttl"]))
        self._leases.add(lease_id)
        self._store.on_lease_lost(lease_id, lambda why: self._lease_gone(lease_id, why))
        return lease_id

    def _keepalive(self, msg: dict[str, Any]) -> Any:
        self._store.refresh(int(msg["l"]))
        return True

    def _revoke(self, msg: dict[str, Any]) -> Any:
        self._store.revoke(int(msg["l"]))
        return True

    def _sink(self, wid: int) -> Callable[[Event], None]:
        def push(event: Event) -> None:
            self._send({"watch": wid, "ev": wire.event_to_wire(event)})

        return push

    def _lease_gone(self, lease_id: int, why: str) -> None:
        if lease_id in self._leases:
            self._leases.discard(lease_id)
            self._send({"lease_lost": lease_id, "why": why})

    # -- output

    def _send(self, obj: dict[str, Any]) -> None:
        if self._transport is not None and not self._transport.is_closing():
            if self._out is not None:
                self._out.append(wire.frame(obj))
            else:  # a push (another connection's write, a lease's end, a ping): with the others of this turn
                if not self._pushes:
                    self._server.corked(self)
                self._pushes.append(wire.frame(obj))
            self._sent = asyncio.get_running_loop().time()

    def flush(self) -> None:
        out, self._pushes = self._pushes, []
        if self._batch:
            batch, self._batch = self._batch, []
            out += [wire.frame({"b": batch[at : at + wire.BATCH]}) for at in range(0, len(batch), wire.BATCH)]
        if out and self._transport is not None and not self._transport.is_closing():
            self._transport.write(b"".join(out))

    def _close(self, why: str) -> None:
        if why:
            logger.debug("closing rendezvous connection from %s: %s", self.peer, why)
        if self._transport is not None:
            if self._out:  # what was said before closing (a refusal) goes first
                self._transport.write(b"".join(self._out))
                self._out.clear()
            self._transport.close()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()


class _Virtual(_Connection):
    """An agent behind a relay: a connection of its own to the store (its leases, its watches: a lost agent loses
    exactly its own), whose frames travel in its relay's batches. The relay authenticated it with the job's secret
    and watches its silence; the relay's own connection was authenticated here."""

    def __init__(self, relay: _Connection, cid: int) -> None:
        super().__init__(relay._server)
        self._relay = relay
        self._cid = cid
        self._state = "ready"
        self.peer = f"{relay.peer} (relayed #{cid})"

    def request(self, msg: dict[str, Any]) -> None:
        self._request(msg)

    def _send(self, obj: dict[str, Any]) -> None:
        self._relay.send_for(self._cid, obj)

    def end(self, why: str) -> None:
        """Its connection ended (its relay said so, or the relay itself was lost): its leases are revoked."""
        self._relay.forget(self._cid)
        self._end(why)


_OPS: dict[str, Callable[[_Connection, dict[str, Any]], Any]] = {
    "get": _Connection._get,
    "put": _Connection._put,
    "cas": _Connection._cas,
    "delete": _Connection._delete,
    "range": _Connection._range,
    "watch": _Connection._watch,
    "unwatch": _Connection._unwatch,
    "grant": _Connection._grant,
    "keepalive": _Connection._keepalive,
    "revoke": _Connection._revoke,
}


def refused(foreign: tuple[str, str] | None, *, proved: bool) -> str:
    """Why a connection is refused at its proof (pure): the secret, or another job's endpoint (``foreign``: this
    server's job, the client's); the job held here is named only to a client that ``proved`` the secret."""
    if foreign is None:
        return "authentication failed: this job's rendezvous needs its secret"
    held, asked = foreign
    if not proved:
        return (f"authentication failed: this endpoint serves another job's rendezvous, not job {asked}'s, with a "
                "secret this node does not have")
    return (f"held by job {held}, not this node's job {asked} (--rdzv-id): another job's rendezvous runs on this "
            "endpoint; give this job an endpoint of its own (--rdzv-endpoint HOST:PORT)")


class StoreServer:
    """Serves ``store`` to the connections it is handed (``adopt``) or accepts itself (``start``), until ``close()``."""

    def __init__(self, store: MemoryStore, secret: bytes | None = None, routing: Routing[_Connection] | None = None,
                 job: str | None = None) -> None:
        self.store = store
        self.secret = secret
        self.job = job  # the run id of the job served here (None: any; the contract tests, a relay's own server)
        self.routing = routing  # past what the host holds: some agents relay, the rest are sent to them
        self.connections: set[_Connection] = set()
        # connections watched for silence, by the liveness their clients asked for (a job asks for one): one timer per
        # liveness sweeps them every half interval, not a timer per connection (thousands of heap entries re-armed)
        self._silence: dict[Liveness, tuple[set[_Connection], asyncio.TimerHandle]] = {}
        self._corked: list[_Connection] = []  # connections with pushes to send at the end of this turn
        self._server: asyncio.Server | None = None
        self._rejected: set[str] = set()
        store.on_close(self._store_closed)

    async def start(self, host: str, port: int) -> int:
        """Bind ``host:port`` (0: the OS picks) and serve; returns the port."""
        self._server, bound = await listen(host, port, self.new_connection)
        return bound

    def new_connection(self) -> _Connection:
        """The protocol of a connection this server serves (a relay's own server forwards instead)."""
        return _Connection(self)

    def adopt(self, transport: asyncio.Transport, data: bytes) -> None:
        """Serve a connection another listener accepted (``rendezvous.listener``), starting with ``data``."""
        connection = self.new_connection()
        transport.set_protocol(connection)
        connection.connection_made(transport)
        connection.data_received(data)

    def corked(self, connection: _Connection) -> None:
        """``connection`` has pushes to send: at the end of this turn of the loop, with every other push to it (a
        round's assignment and the round key reach a node in one write; thousands of nodes are one turn's work)."""
        if not self._corked:
            asyncio.get_running_loop().call_soon(self._flush)
        self._corked.append(connection)

    def _flush(self) -> None:
        corked, self._corked = self._corked, []
        for connection in corked:
            connection.flush()

    def watch_silence(self, connection: _Connection, liveness: Liveness) -> None:
        """Check ``connection`` for silence every half ``liveness.interval`` (``_Connection.check_silence``)."""
        swept = self._silence.get(liveness)
        if swept is None:
            loop = asyncio.get_running_loop()
            due = loop.time() + liveness.interval / 2
            swept = self._silence[liveness] = ({connection}, loop.call_at(due, self._sweep, liveness, due))
        else:
            swept[0].add(connection)

    def unwatch_silence(self, connection: _Connection) -> None:
        for connections, _ in self._silence.values():
            connections.discard(connection)

    def _sweep(self, liveness: Liveness, due: float) -> None:
        connections, _ = self._silence[liveness]
        if not connections:  # nobody left with this liveness: no timer either
            del self._silence[liveness]
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        late = max(0.0, now - due)
        for connection in list(connections):
            connection.check_silence(now, late)
        due = now + liveness.interval / 2
        self._silence[liveness] = (connections, loop.call_at(due, self._sweep, liveness, due))

    def rejected(self, peer: str) -> None:
        """A peer failed authentication: logged once per address, not once per attempt."""
        host = peer.rsplit(":", 1)[0]
        if host not in self._rejected:
            self._rejected.add(host)
            logger.warning("rendezvous: rejected a connection from %s that does not know this job's secret", host)

    def _store_closed(self) -> None:
        for connection in list(self.connections):
            connection.abort()

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for connection in list(self.connections):
            connection.abort()
        for _, timer in self._silence.values():
            timer.cancel()
        self._silence.clear()
        if server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), 5.0)
