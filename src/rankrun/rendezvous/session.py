"""One node's place in a multi-node job, from joining to leaving: ``open_session(spec, worker_store, say)``.

How the backend is opened and closed lives here; the agent's rounds (``agent.multinode``) get a ``Session``: this
node's ``Member``, its address, and what the backend that opened it states of itself for them: whether this process
hosts the job's store (``Session.hosting``: it holds the other nodes' connections and serves the workers' store the
store relays forward to) and whether the workers' store may be relayed at all (``Session.relayable``). Beyond those
they know whether it is etcd (which security notice to print, before a session is open) and, on etcd, the job lease
(``Member.job``) that the job's keys are bound to. Opening picks the backend and this node's part in it:

- the embedded store, hosting: the first agent able to bind the endpoint (dynamic, unless
  ``is_host`` says otherwise) or ``--node-rank 0`` (static) serves the in-memory store and the
  workers' TCPStore on that one port (``rendezvous.listener``) and runs the coordinator;
- the embedded store, joining: every other agent connects (retrying until ``join_timeout``, with
  a line every few seconds) and joins;
- etcd: every agent adopts (or creates) the job lease, serves its own worker store on port 0,
  joins, and campaigns; the one elected coordinates until it leaves or is deposed. A node whose health check
  failed before it joined says so in its join and does not campaign: it waits for its exclusion.

While the session is open its background work runs beside the caller's: the keep-alives and, where
this node coordinates, the coordinator, all in one ``TaskGroup`` (a failure there cancels the
caller and surfaces as that error). Closing leaves the job, lets the other nodes read the end
(the coordinator waits for them, bounded by ``close_timeout``), removes a finished job's keys
from etcd, and closes the stores: one ``AsyncExitStack``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rankrun.errors import LauncherError, NotCoordinator, StoreError
from rankrun.fdlimit import nofile, rendezvous_group
from rankrun.rendezvous.coordinator import Coordinator
from rankrun.rendezvous.election import campaign, job_lease
from rankrun.rendezvous.keys import Keys
from rankrun.rendezvous.listener import SharedListener
from rankrun.rendezvous.member import Member
from rankrun.rendezvous.round import NodeInfo, Settings
from rankrun.spec import DynamicRendezvous, LaunchSpec, StaticRendezvous, on_etcd, rendezvous_name
from rankrun.store.api import AuthenticationFailed, EventKind, RendezvousHeld, Store, StoreUnavailable
from rankrun.store.embedded.client import StoreClient
from rankrun.store.embedded.liveness import Liveness
from rankrun.store.embedded.relay import Relay
from rankrun.store.embedded.routing import Routing, relays_for
from rankrun.store.embedded.server import StoreServer
from rankrun.store.memory import MemoryStore
from rankrun.workerstore.relayhost import StoreRelayHost
from rankrun.workerstore.tcpstore import TCPStoreServer

if TYPE_CHECKING:
    from rankrun.store.etcd.store import EtcdStore

PROGRESS_EVERY = 5.0  # seconds between two "still trying to reach the host" lines
FIRST_CONTACT = 3.0  # etcd: seconds to keep trying the endpoints at start before it is an infrastructure error
CONNECT_RETRY = (0.05, 1.0)  # first and longest pause between attempts to reach a host that is not up yet

Say = Callable[[str], None]
Lead = Callable[["Session"], Coroutine[Any, Any, None]]  # a shared store: campaign, then coordinate once elected
# (spec, worker store, say, exit stack, why this node is unhealthy or None): its session, and its campaign (etcd)
Backend = Callable[[LaunchSpec, TCPStoreServer, Say, contextlib.AsyncExitStack, str | None],
                   Awaitable[tuple["Session", Lead | None]]]


@dataclass
class Session:
    member: Member
    address: str  # this node's side of the rendezvous connection (what other nodes reach it on)
    store: Store
    lost_why: str  # why a lease could be lost, when the lease itself cannot tell
    coordinator: Coordinator | None = None
    # The backend's word: the job's store is one of its agents' (the embedded store, which serves the workers' store
    # on its own port, and the store relays' host beside it); False on a store no agent hosts (etcd).
    agent_hosted: bool = True

    @property
    def hosting(self) -> bool:
        """This process hosts the job's store: it holds the other nodes' rendezvous connections (a shared store such as
        etcd holds them, never an agent), and the workers' store it serves on the same port is the one the other
        nodes' store relays forward to (its own workers reach it directly). The embedded store's host, which
        coordinates."""
        return self.agent_hosted and self.coordinator is not None

    @property
    def relayable(self) -> bool:
        """The workers' store may be relayed (``--store-relays``): it is served beside the relays' host
        (``workerstore.relayhost``) on the embedded store's port. On etcd it is the coordinator's own TCPStore, on a
        port that speaks only torch's protocol: never."""
        return self.agent_hosted

    def why_lost(self) -> str:
        """Why this node lost its place, in words for the user."""
        return self.member.lease.why or self.lost_why


def settings(spec: LaunchSpec) -> Settings:
    rdzv = spec.rendezvous
    return Settings(rdzv.min_nodes, rdzv.max_nodes, rdzv.conf.last_call_timeout, spec.restart.max_restarts,
                    static=isinstance(rdzv, StaticRendezvous), max_node_failures=spec.restart.max_node_failures,
                    network_check=spec.health.network,
                    health_timeout=spec.health.timeout if spec.health.check is not None else None,
                    join_timeout=rdzv.conf.join_timeout)


def endpoint(spec: LaunchSpec) -> tuple[str, int]:
    rdzv = spec.rendezvous
    if isinstance(rdzv, StaticRendezvous):
        return rdzv.master_addr, rdzv.master_port
    assert isinstance(rdzv, DynamicRendezvous)
    return rdzv.endpoint_host, rdzv.endpoint_port


def ttl(spec: LaunchSpec) -> float:
    """The lease TTL: keep_alive_interval x keep_alive_max_attempt."""
    conf = spec.rendezvous.conf
    return conf.keep_alive_interval * conf.keep_alive_max_attempt


@contextlib.asynccontextmanager
async def open_session(
    spec: LaunchSpec, worker_store: TCPStoreServer, say: Say, *, backend: Backend | None = None,
    unhealthy: str | None = None,
) -> AsyncIterator[Session]:
    """Join the job (hosting it, joining it, or through etcd); leave it, and close everything, on exit.

    ``backend`` opens the store and joins (what the spec asks for by default); tests give one that joins a shared
    in-memory store, so that many agents run in one process on fakes. ``unhealthy``: why this node's health check
    failed before it joins; its join says so (``NodeInfo.unhealthy``), so that no round ever counts it, and on etcd
    it does not campaign: a node that runs no workers must not coordinate the job while a healthy one can.
    """
    conf = spec.rendezvous.conf
    async with contextlib.AsyncExitStack() as stack:
        session, lead = await (backend or _backend)(spec, worker_store, say, stack, unhealthy)
        async with asyncio.TaskGroup() as group:  # the keep-alives and the coordinator live exactly as long as the session
            background = [group.create_task(session.member.keep_alive(conf.keep_alive_interval, conf.keep_alive_max_attempt))]
            if session.coordinator is not None:
                background.append(group.create_task(session.coordinator.run()))
            leading = group.create_task(lead(session)) if lead is not None and unhealthy is None else None
            try:
                yield session
            finally:
                if leading is not None:  # no campaign once this node leaves (it would be on a revoked lease)
                    leading.cancel()
                    await asyncio.gather(leading, return_exceptions=True)  # its error, if any, the group raises
                await session.member.leave()
                if session.coordinator is not None:
                    all_left = await _let_the_others_leave(session, conf.close_timeout, say)
                    if all_left and lead is not None:
                        await _remove_the_jobs_keys(session, conf.join_timeout)
                for task in background:
                    task.cancel()


async def _backend(
    spec: LaunchSpec, worker_store: TCPStoreServer, say: Say, stack: contextlib.AsyncExitStack, unhealthy: str | None
) -> tuple[Session, Lead | None]:
    if on_etcd(spec.rendezvous):
        return await _open_etcd(spec, worker_store, say, stack, unhealthy)
    return await _open_embedded(spec, worker_store, say, stack, unhealthy), None


# --------------------------------------------------------------------------- the embedded store


async def _open_embedded(
    spec: LaunchSpec, worker_store: TCPStoreServer, say: Say, stack: contextlib.AsyncExitStack, unhealthy: str | None
) -> Session:
    rdzv = spec.rendezvous
    host, port = endpoint(spec)
    deadline = asyncio.get_running_loop().time() + rdzv.conf.join_timeout  # resolving and reaching the host: one bound
    await _resolvable(spec, host, port, say, deadline)
    keys = Keys.for_run(rdzv.run_id)
    lost_why = f"its lease expired or the connection to the host at {host}:{port} was lost"
    hosted = await _try_to_host(spec, worker_store, host, port, stack, say=say)
    if hosted is not None:
        listener, memory, bound = hosted
        addr = spec.local_addr or listener.address
        master = await _workers_address(spec, listener, bound, say)
        coordinator = Coordinator(memory, keys, settings(spec), master=lambda: (master, bound),
                                  before_round=worker_store.reset, why_gone=memory.why_deleted, say=say)
        member = await Member.join(memory, keys, node_info(spec, addr, is_host=True, unhealthy=unhealthy), ttl(spec))
        return Session(member, listener.address, memory, lost_why, coordinator)
    client = await _connect(spec, host, port, say, deadline)
    stack.push_async_callback(client.close)
    addr = spec.local_addr or client.local_address or host
    if client.via is not None:
        say(f"rendezvous {host}:{port}: joined through the relay at {client.via} (the host sends nodes to relays "
            f"past what it holds itself)")
        lost_why = f"its lease expired or the connection to the host at {host}:{port} through the relay at {client.via} was lost"
    elif client.serve is not None:
        await _relay(spec, (host, port), addr, client.serve, say, stack)
    member = await Member.join(client, keys, node_info(spec, addr, is_host=False, unhealthy=unhealthy), ttl(spec))
    return Session(member, client.local_address or host, client, lost_why)


async def _workers_address(spec: LaunchSpec, listener: SharedListener, port: int, say: Say) -> str:
    """The address the workers are told (MASTER_ADDR) for the store this host serves on the endpoint's port.

    Static: ``--master-addr``, as under torchrun. Dynamic: this host's ``--local-addr``, as under torchrun (group rank
    0's address), listened on too when it is not the endpoint's own (a management network for the endpoint, a fast
    one named by ``--local-addr``); where it cannot be, the endpoint's address, said in one line. Telling the workers
    an address nothing listens on left torch retrying its connection for 30 minutes in silence.
    """
    wanted = spec.local_addr
    if isinstance(spec.rendezvous, StaticRendezvous) or not wanted or wanted == listener.address:
        return listener.address
    try:
        await listener.also(wanted, port)
    except StoreError as exc:
        say(f"rendezvous: the workers' store cannot listen on --local-addr {wanted} as well ({exc}); the workers reach "
            f"it at the endpoint's address, {listener.address}:{port} (MASTER_ADDR, MASTER_PORT)")
        return listener.address
    return wanted


async def _relay(  # noqa: PLR0917
    spec: LaunchSpec, upstream: tuple[str, int], addr: str, token: int, say: Say, stack: contextlib.AsyncExitStack
) -> None:
    """The host asked this node to relay other nodes' rendezvous connections (``store.embedded.routing``): a relay on
    this node's address, kept until the nodes it serves have left (they read the job's end through it), bounded by
    close_timeout."""
    conf = spec.rendezvous.conf
    relay = Relay(spec.secret, Liveness.of_lease(conf.keep_alive_interval, conf.keep_alive_max_attempt))
    bound = await relay.start(addr, 0, upstream, spec.local_addr, token=token)

    async def close() -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(relay.empty(), conf.close_timeout)
        await relay.close()

    stack.push_async_callback(close)
    say(f"rendezvous {upstream[0]}:{upstream[1]}: this node relays other nodes' connections to the host, on {addr}:{bound}")


async def _try_to_host(
    spec: LaunchSpec, worker_store: TCPStoreServer, host: str, port: int, stack: contextlib.AsyncExitStack, *,
    say: Say) -> tuple[SharedListener, MemoryStore, int] | None:
    """Bind the endpoint if this node is the one to host; None if another node hosts."""
    rdzv = spec.rendezvous
    if isinstance(rdzv, StaticRendezvous):
        must = rdzv.node_rank == 0
        if not must:
            return None
    else:
        if rdzv.conf.is_host is False:
            return None
        must = rdzv.conf.is_host is True
    memory = MemoryStore()
    routing, line = _routing(spec)
    server = StoreServer(memory, spec.secret, routing=routing, job=rdzv.run_id)  # another job's nodes: refused at once
    listener = SharedListener(server, worker_store)
    try:
        bound = await listener.start(host, port)
    except StoreError as exc:
        cause = exc.__cause__
        not_ours = isinstance(cause, OSError) and cause.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL)
        await memory.close()
        if must or not not_ours:
            raise
        return None  # another agent on this machine hosts it, or the address is not this machine's: join it
    stack.push_async_callback(memory.close)  # closed last: after the server and the listener
    stack.push_async_callback(server.close)
    stack.push_async_callback(listener.close)
    listener.store_relays = StoreRelayHost(worker_store, spec.secret)  # the other nodes' store relays, if they relay
    stack.push_async_callback(listener.store_relays.close)
    if line is not None:
        say(line)
    return listener, memory, bound


def _routing(spec: LaunchSpec) -> tuple[Routing[Any] | None, str | None]:
    """Past what this host holds, some nodes relay the others' rendezvous connections (``store.embedded.routing``);
    and the line that says so when it was the automatic choice."""
    rdzv = spec.rendezvous
    soft, _ = nofile()
    group = rendezvous_group(rdzv.conf.relay_group, nodes=rdzv.max_nodes, local_workers=spec.worker.nproc, soft=soft)
    wanted = relays_for(rdzv.max_nodes, group)
    if not wanted:
        return None, None
    line = None if rdzv.conf.relay_group is not None else (
        f"rendezvous: this host cannot hold {rdzv.max_nodes} nodes' connections under its open-files limit "
        f"(RLIMIT_NOFILE {soft}): {wanted} of the nodes relay the others', up to {group} each "
        f"(--rdzv-conf relay_group=0: never)")
    return Routing(wanted), line


async def _resolvable(spec: LaunchSpec, host: str, port: int, say: Say, deadline: float) -> None:
    """Wait until the endpoint's name resolves, saying so at once and every few seconds; bounded by join_timeout.

    A scheduler often starts the nodes before the master's DNS record exists (a Kubernetes Service, a pod's
    hostname), for the master itself too: waiting is the cure, not exit 3. An address resolves at once."""
    conf = spec.rendezvous.conf
    loop = asyncio.get_running_loop()
    pause, said = CONNECT_RETRY[0], float("-inf")
    while True:
        try:
            await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            return
        except socket.gaierror as exc:
            reason = exc.strerror or str(exc)
        if loop.time() + pause > deadline:
            raise LauncherError(f"rendezvous {host}:{port}: {host} did not resolve within {conf.join_timeout:g} s "
                                f"(join_timeout): {reason}")
        if loop.time() - said >= PROGRESS_EVERY:
            say(f"rendezvous {host}:{port}: waiting for {host} to resolve: {reason}")
            said = loop.time()
        await asyncio.sleep(pause)  # no event announces a DNS record: retry with backoff
        pause = min(pause * 2, CONNECT_RETRY[1])


async def _connect(spec: LaunchSpec, host: str, port: int, say: Say, deadline: float) -> StoreClient:
    """Reach the host, retrying (with backoff, saying why every few seconds) until ``deadline``: join_timeout after
    this node set out to join (the time its name took to resolve is part of it)."""
    conf = spec.rendezvous.conf
    loop = asyncio.get_running_loop()
    pause, said = CONNECT_RETRY[0], loop.time()
    liveness = Liveness.of_lease(conf.keep_alive_interval, conf.keep_alive_max_attempt)
    while True:
        try:
            return await StoreClient.connect(host, port, spec.secret, spec.local_addr, liveness, relays=True,
                                             job=spec.rendezvous.run_id)
        except (AuthenticationFailed, RendezvousHeld):  # no retry changes a secret, or another job's endpoint
            raise
        except StoreUnavailable as exc:
            if loop.time() + pause > deadline:
                raise
            if loop.time() - said >= PROGRESS_EVERY:
                waited = loop.time() - (deadline - conf.join_timeout)
                say(f"{exc}; retrying (waited {waited:.0f} s of {conf.join_timeout:.0f})")
                said = loop.time()
        await asyncio.sleep(pause)  # no event announces a host that is not listening yet: retry with backoff
        pause = min(pause * 2, CONNECT_RETRY[1])


def node_info(spec: LaunchSpec, addr: str, *, is_host: bool, unhealthy: str | None = None) -> NodeInfo:
    rdzv = spec.rendezvous
    static_rank = rdzv.node_rank if isinstance(rdzv, StaticRendezvous) else None
    node_id = f"{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}"
    return NodeInfo(node_id, 0, spec.worker.nproc, spec.worker.role, addr, socket.gethostname(), static_rank, is_host,
                    unhealthy)


# --------------------------------------------------------------------------- etcd


async def _open_etcd(
    spec: LaunchSpec, worker_store: TCPStoreServer, say: Say, stack: contextlib.AsyncExitStack, unhealthy: str | None
) -> tuple[Session, Lead]:
    """Join through etcd: adopt (or create) the job lease, start this node's worker store, register (saying
    ``unhealthy``, why its check failed, if it did: ``open_session`` then runs no campaign)."""
    rdzv = spec.rendezvous
    assert isinstance(rdzv, DynamicRendezvous)
    store = _etcd_store(spec)
    stack.push_async_callback(store.close)
    keys = Keys.for_run(rdzv.run_id, rdzv.prefix)
    lease_ttl = ttl(spec)
    try:
        job = await job_lease(store, keys.job, 2 * lease_ttl, store.lease)
        # from now on an outage (an election) is waited out, up to read_timeout, and said
        store.gateway.retry_for = rdzv.conf.read_timeout
        store.gateway.say = lambda line: say(f"{rendezvous_name(rdzv.run_id)}: {line}")
        addr = spec.local_addr or store.local_address or "127.0.0.1"
        port = await worker_store.start(addr, 0)
        member = await Member.join(store, keys, node_info(spec, addr, is_host=False, unhealthy=unhealthy), lease_ttl, job)
    except StoreUnavailable as exc:
        tried = ", ".join(map(str, rdzv.etcd_endpoints))
        raise LauncherError(f"{rendezvous_name(rdzv.run_id)}: cannot use etcd ({tried}): {exc}") from None
    lost_why = (f"its etcd lease expired (no keep-alive reached etcd for {lease_ttl:g} s: keep_alive_interval x "
                "keep_alive_max_attempt; was this agent stopped or starved?)")
    session = Session(member, addr, store, lost_why, agent_hosted=False)
    return session, _etcd_lead(spec, store, master=(addr, port), worker_store=worker_store, say=say)


def _etcd_store(spec: LaunchSpec) -> EtcdStore:
    """The etcd client of the rendezvous's endpoints: TLS where one is https, first contact tried ``FIRST_CONTACT`` s."""
    from rankrun.store.etcd.gateway import Gateway, tls_context  # noqa: PLC0415
    from rankrun.store.etcd.store import EtcdStore  # noqa: PLC0415 - only etcd jobs pay for ssl and the client

    rdzv = spec.rendezvous
    assert isinstance(rdzv, DynamicRendezvous)
    conf = rdzv.conf
    https = any(e.scheme == "https" for e in rdzv.etcd_endpoints)
    context = tls_context(conf.ca_cert, conf.ssl_cert, conf.ssl_cert_key) if https else None
    return EtcdStore(Gateway(rdzv.etcd_endpoints, context=context, user=conf.user, password=spec.etcd_password,
                             retry_for=FIRST_CONTACT))


def _etcd_lead(spec: LaunchSpec, store: EtcdStore, *, master: tuple[str, int], worker_store: TCPStoreServer,
               say: Say) -> Lead:
    """An etcd node's campaign: once elected (now or when the coordinator is lost), it coordinates, writing only while
    it holds the coordinator key (its fence), each key bound to the job lease."""

    async def lead(session: Session) -> None:
        member, keys = session.member, session.member.keys
        assert member.job is not None
        await campaign(store, keys.coordinator, member.info.id, member.lease)
        if member.lease.lost.is_set():
            return
        job_id, me = member.job.id, member.info.id.encode()

        async def fence(key: str, value: bytes) -> bool:
            return await store.put_if_held(key, value, lease=job_id, holder_key=keys.coordinator, holder=me)

        gone = f"its etcd lease ended (no keep-alive for {ttl(spec):g} s, or it left)"
        session.coordinator = Coordinator(store, keys, settings(spec), master=lambda: master,
                                          before_round=worker_store.reset, leader=member.info.id, fence=fence,
                                          why_gone=lambda _key: gone, say=say)
        try:
            await session.coordinator.run()
        except NotCoordinator:  # deposed (its lease ended while it was stopped): the rounds notice and exit
            session.coordinator = None

    return lead


async def _remove_the_jobs_keys(session: Session, keep_closed_for: float) -> None:
    """The job is over and every node has left: delete its keys but ``closed``, which turns late nodes away
    for ``keep_closed_for`` seconds (join_timeout: a late node would have waited that long) on a lease of its own."""
    from rankrun.store.etcd.store import EtcdStore  # noqa: PLC0415 - only etcd jobs get here

    store = session.store
    assert isinstance(store, EtcdStore)
    keys = session.member.keys
    with contextlib.suppress(StoreUnavailable):
        entry = await store.get(keys.closed)
        marker = await store.grant(keep_closed_for)
        await store.put(keys.closed, entry.value if entry else b"{}", lease=marker.id)
        await store.delete_prefix(keys.root, keep=keys.closed)


# --------------------------------------------------------------------------- the end


async def _let_the_others_leave(session: Session, timeout: float, say: Say) -> bool:
    """The coordinator stays until every other node has read the end and left (their node keys gone), bounded.

    Returns whether they all did.
    """
    store = session.store
    keys = session.member.keys
    with contextlib.suppress(TimeoutError, StoreUnavailable):
        async with asyncio.timeout(timeout):
            entries, revision = await store.range(keys.nodes)
            left = {e.key for e in entries}
            if not left:
                return True
            say(f"rendezvous: the job has ended; waiting up to {timeout:.0f} s for {len(left)} other node(s) to leave")
            watch = await store.watch(keys.nodes, revision)
            try:
                async for event in watch:
                    if event.kind is EventKind.DELETE:
                        left.discard(event.key)
                    else:
                        left.add(event.key)  # registered just now: it will read the end and leave too
                    if not left:
                        return True
            finally:
                await watch.close()
    return False
