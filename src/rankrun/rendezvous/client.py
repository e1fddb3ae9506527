"""A ``rendezvous.store.Store`` over one connection to the embedded store server (``rendezvous.server``).

Requests carry ids and may be in flight together; replies resolve their futures, pushed watch
events go to their watch's queue, a ``lease_lost`` push sets that lease's ``lost`` event. When
the connection goes, every pending call fails with ``StoreUnavailable`` naming the endpoint,
every watch ends with it, and every lease is lost (the server revokes them too): the caller —
the rendezvous — decides whether to rejoin or exit. There is no silent reconnect, because a
new connection would not own the old leases.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
from collections.abc import AsyncIterator
from typing import Any

from rankrun.rendezvous import wire
from rankrun.rendezvous.store import AuthenticationFailed, Compacted, Entry, Event, LeaseHandle, LeaseLost, StoreUnavailable

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
        self._client.lost(f"{exc.strerror or exc}" if isinstance(exc, OSError) else "the connection was closed")
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
            self._lost.set()


class ClientWatch:
    def __init__(self, client: StoreClient, wid: int) -> None:
        self._client = client
        self.wid = wid
        self.queue: asyncio.Queue[Event | str] = asyncio.Queue()  # a str: the stream ended, and why
        self._closed = False

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._events()

    async def _events(self) -> AsyncIterator[Event]:
        while not self._closed:
            item = await self.queue.get()
            if isinstance(item, str):
                raise StoreUnavailable(item)
            yield item

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._client.watches.pop(self.wid, None)
        with contextlib.suppress(StoreUnavailable):
            await self._client.call("unwatch", w=self.wid)


class StoreClient:
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.ready = False
        self.local_address: str | None = None  # this side's address of the connection (what peers can reach)
        self.watches: dict[int, ClientWatch] = {}
        self._protocol: _Protocol | None = None
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._leases: dict[int, ClientLease] = {}
        self._lost_early: set[int] = set()
        self._ids = itertools.count(1)
        self._closed_why: str | None = None

    @classmethod
    async def connect(cls, host: str, port: int, secret: bytes | None = None, local_addr: str | None = None) -> StoreClient:
        """Connect and authenticate; ``StoreUnavailable`` (``AuthenticationFailed``) naming the endpoint otherwise."""
        client = cls(f"{host}:{port}")
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
        try:
            await client._handshake(secret)
        except BaseException:
            transport.abort()
            raise
        return client

    async def _handshake(self, secret: bytes | None) -> None:
        assert self._protocol is not None
        assert self._protocol.transport is not None
        nonce = os.urandom(16)
        self._protocol.transport.write(wire.MAGIC + wire.frame({"hello": wire.VERSION, "nonce": wire.b64(nonce)}))
        hello = await self._handshake_frame()
        if hello.get("version") != wire.VERSION:
            raise StoreUnavailable(f"rendezvous {self.endpoint}: speaks protocol {hello.get('version')!r}, not {wire.VERSION}")
        challenge = wire.unb64(hello.get("challenge", ""))
        if hello.get("auth") and secret is None:
            raise AuthenticationFailed(f"rendezvous {self.endpoint}: the job needs a secret "
                                       "(set RANKRUN_RDZV_SECRET or --rdzv-conf secret_file=PATH)")
        if not hello.get("auth") and secret is not None:
            raise AuthenticationFailed(f"rendezvous {self.endpoint}: it does not authenticate, but this node has a secret")
        proof = wire.client_proof(secret, challenge, nonce) if secret is not None else ""
        self._protocol.transport.write(wire.frame({"proof": proof}))
        answer = await self._handshake_frame()
        if not answer.get("ok"):
            raise AuthenticationFailed(f"rendezvous {self.endpoint}: {answer.get('error', 'refused')}")
        if secret is not None and not wire.proof_matches(wire.server_proof(secret, challenge, nonce), answer.get("proof")):
            raise AuthenticationFailed(f"rendezvous {self.endpoint}: the server does not know this job's secret")
        self.ready = True

    async def _handshake_frame(self) -> dict[str, Any]:
        assert self._protocol is not None
        msg = await self._protocol.inbox.get()
        if not msg:
            raise StoreUnavailable(f"rendezvous {self.endpoint}: {self._closed_why or 'closed during the handshake'}")
        return msg

    # -- protocol plumbing

    def dispatch(self, msg: dict[str, Any]) -> None:
        if "watch" in msg:
            watch = self.watches.get(int(msg["watch"]))
            if watch is not None:
                watch.queue.put_nowait(wire.event_from_wire(msg["ev"]))
        elif "lease_lost" in msg:
            lease = self._leases.pop(int(msg["lease_lost"]), None)
            if lease is not None:
                lease.lost.set()
            else:
                self._lost_early.add(int(msg["lease_lost"]))  # before its grant's caller has resumed
        else:
            future = self._pending.pop(int(msg.get("id", 0)), None)
            if future is None or future.done():
                return
            if "err" in msg:
                kind = _ERRORS.get(str(msg["err"]), StoreUnavailable)
                future.set_exception(kind(f"rendezvous {self.endpoint}: {msg.get('msg', msg['err'])}"))
            else:
                future.set_result(msg.get("r"))

    def lost(self, why: str) -> None:
        if self._closed_why is not None:
            return
        self._closed_why = why
        self.ready = False
        error = f"lost the connection to the rendezvous at {self.endpoint}: {why}"
        for future in self._pending.values():
            if not future.done():
                future.set_exception(StoreUnavailable(error))
        self._pending.clear()
        for watch in self.watches.values():
            watch.queue.put_nowait(error)
        for lease in self._leases.values():
            lease.lost.set()
        self._leases.clear()
        if self._protocol is not None and self._protocol.transport is not None:
            self._protocol.transport.abort()

    async def call(self, op: str, **fields: Any) -> Any:
        if self._closed_why is not None or self._protocol is None or self._protocol.transport is None:
            raise StoreUnavailable(f"no connection to the rendezvous at {self.endpoint}: {self._closed_why or 'not connected'}")
        rid = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        self._protocol.transport.write(wire.frame({"id": rid, "op": op, **fields}))
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
            lease.lost.set()
        else:
            self._leases[lease_id] = lease
        return lease

    async def close(self) -> None:
        """Close the connection: the server revokes this client's leases."""
        self.lost("closed by this node")
