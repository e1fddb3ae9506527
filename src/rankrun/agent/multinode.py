"""Several nodes: host or join the rendezvous, then run round after round until the job ends.

The node that hosts (dynamic: the first agent able to bind ``--rdzv-endpoint``, unless
``is_host`` says otherwise; static: ``--node-rank 0`` on ``--master-addr:--master-port``) serves
the in-memory store and the worker store on that one port (``rendezvous.listener``) and runs the
coordinator; every node, the host included, is a ``Member``. The loop::

    join → wait for my assignment (bounded by join_timeout, a progress line every 5 s)
         → attempt, stopped early when the round key moves on (a node joined or left, another
           node's workers failed) or this node's lease is lost
         → report how my workers ended → wait for the next word: a new round, or the end

Restarts are decided by the coordinator for the whole job (one budget); every node ends with the
same outcome and the job's first failure in its report.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rankrun.agent.attempt import AttemptResult, run_attempt
from rankrun.agent.deps import AgentDeps
from rankrun.agent.events import first_error, first_of
from rankrun.agent.plan import AttemptPlan, Membership
from rankrun.errors import EXIT_SIGNAL_BASE, EXIT_SUCCESS, EXIT_WORKERS_FAILED, LauncherError, StoreError
from rankrun.logs.layout import RunLogs
from rankrun.netif import collective_interface, interface_of, is_loopback
from rankrun.proc.signals import Interrupted, StopStream
from rankrun.rendezvous.coordinator import Coordinator, NotCoordinator
from rankrun.rendezvous.election import campaign, job_lease
from rankrun.rendezvous.keys import Assignment, Keys
from rankrun.rendezvous.listener import SharedListener
from rankrun.rendezvous.member import Ended, Member, Spare
from rankrun.rendezvous.round import NodeInfo, Settings
from rankrun.report.failure import describe_status, exception_text, root_cause, signal_name
from rankrun.spec import DynamicRendezvous, LaunchSpec, StaticRendezvous, on_etcd
from rankrun.store.api import EventKind, Store, StoreUnavailable
from rankrun.store.embedded.client import StoreClient
from rankrun.store.embedded.liveness import Liveness
from rankrun.store.embedded.server import StoreServer
from rankrun.store.memory import MemoryStore

if TYPE_CHECKING:
    from rankrun.store.etcd.store import EtcdStore

PROGRESS_EVERY = 5.0  # seconds between "3/4 nodes joined" lines while waiting
FIRST_CONTACT = 3.0  # etcd: seconds to keep trying the endpoints at start before it is an infrastructure error
CONNECT_RETRY = (0.05, 1.0)  # first and longest pause between attempts to reach a host that is not up yet


@dataclass(frozen=True)
class Outcome:
    exit_code: int
    restarts: int
    report: AttemptResult | None = None  # this node's last attempt, when a failure report is due
    job_cause: str = ""  # the job's first failure, from whichever node had it


@dataclass
class _Session:
    store: Store
    member: Member
    address: str  # this node's side of the rendezvous connection (what other nodes reach it on)
    coordinator: Coordinator | None = None
    listener: SharedListener | None = None
    server: StoreServer | None = None
    memory: MemoryStore | None = None
    client: StoreClient | None = None
    shared: EtcdStore | None = None  # etcd: the coordinator is elected, keys outlive any one node
    master: tuple[str, int] = ("", 0)  # etcd: this node's own worker store, used when it is group rank 0


async def run_multinode(spec: LaunchSpec, deps: AgentDeps, stops: StopStream, logs: RunLogs) -> Outcome:
    rdzv = spec.rendezvous
    assert isinstance(rdzv, StaticRendezvous | DynamicRendezvous)
    etcd = on_etcd(rdzv)
    if not etcd and spec.secret is None:
        deps.console.say(f"rendezvous {rdzv.run_id}: no secret (RANKRUN_RDZV_SECRET or --rdzv-conf secret_file=PATH): "
                         "any host that can reach the endpoint can join this job")
    session = await _open(spec, deps)
    if etcd and rdzv.conf.user is None and rdzv.conf.ssl_cert is None:  # etcd's own users or certificates guard it
        deps.console.say(f"rendezvous {rdzv.run_id}: etcd without a user or client certificate (--rdzv-conf user=, "
                         "password_file= or ssl_cert=, ssl_cert_key=): whoever can reach etcd can join this job")
    conf = rdzv.conf
    try:
        async with asyncio.TaskGroup() as group:  # the coordinator and the keep-alives live exactly as long as the rounds
            background = [group.create_task(session.member.keep_alive(conf.keep_alive_interval, conf.keep_alive_max_attempt))]
            if session.coordinator is not None:
                background.append(group.create_task(session.coordinator.run()))
            lead = group.create_task(_lead(spec, deps, session)) if session.shared is not None else None
            try:
                return await _rounds(spec, deps, stops, logs, session)
            finally:
                if lead is not None:  # no campaign once this node leaves (it would be on a revoked lease)
                    lead.cancel()
                    await asyncio.gather(lead, return_exceptions=True)  # its error, if any, the group raises
                await session.member.leave()
                if session.coordinator is not None:
                    all_left = await _let_the_others_leave(session, conf.close_timeout, deps)
                    if all_left and session.shared is not None:
                        await _remove_the_jobs_keys(session, conf.join_timeout)
                for task in background:
                    task.cancel()
    except BaseExceptionGroup as failed:  # one of them failed: that error, not a group, is what the user sees
        raise first_error(failed) from None
    finally:
        await _close(session)


# --------------------------------------------------------------------------- hosting or joining


def _settings(spec: LaunchSpec) -> Settings:
    rdzv = spec.rendezvous
    return Settings(rdzv.min_nodes, rdzv.max_nodes, rdzv.conf.last_call_timeout, spec.restart.max_restarts,
                    static=isinstance(rdzv, StaticRendezvous))


def _endpoint(spec: LaunchSpec) -> tuple[str, int]:
    rdzv = spec.rendezvous
    if isinstance(rdzv, StaticRendezvous):
        return rdzv.master_addr, rdzv.master_port
    assert isinstance(rdzv, DynamicRendezvous)
    return rdzv.endpoint_host, rdzv.endpoint_port


async def _open(spec: LaunchSpec, deps: AgentDeps) -> _Session:
    rdzv = spec.rendezvous
    if on_etcd(rdzv):
        assert isinstance(rdzv, DynamicRendezvous)
        return await _open_etcd(spec, deps, rdzv)
    host, port = _endpoint(spec)
    keys = Keys.for_run(rdzv.run_id)
    ttl = rdzv.conf.keep_alive_interval * rdzv.conf.keep_alive_max_attempt
    hosted = await _try_to_host(spec, deps, host, port)
    if hosted is not None:
        listener, server, memory, bound = hosted
        addr = spec.local_addr or listener.address
        coordinator = Coordinator(memory, keys, _settings(spec), master=lambda: (addr, bound),
                                  before_round=deps.worker_store.reset, why_gone=memory.why_deleted)
        member = await Member.join(memory, keys, _node_info(spec, addr, is_host=True), ttl)
        return _Session(memory, member, listener.address, coordinator, listener, server, memory)
    client = await _connect(spec, deps, host, port)
    addr = spec.local_addr or client.local_address or host
    try:
        member = await Member.join(client, keys, _node_info(spec, addr, is_host=False), ttl)
    except BaseException:
        await client.close()
        raise
    return _Session(client, member, client.local_address or host, client=client)


async def _open_etcd(spec: LaunchSpec, deps: AgentDeps, rdzv: DynamicRendezvous) -> _Session:
    """Join through etcd: adopt (or create) the job lease, start this node's worker store, register."""
    from rankrun.store.etcd.gateway import Gateway, tls_context  # noqa: PLC0415
    from rankrun.store.etcd.store import EtcdStore  # noqa: PLC0415 - only etcd jobs pay for ssl and the client

    conf = rdzv.conf
    https = any(e.scheme == "https" for e in rdzv.etcd_endpoints)
    context = tls_context(conf.ca_cert, conf.ssl_cert, conf.ssl_cert_key) if https else None
    gateway = Gateway(rdzv.etcd_endpoints, context=context, user=conf.user, password=spec.etcd_password,
                      retry_for=FIRST_CONTACT)
    store = EtcdStore(gateway)
    keys = Keys.for_run(rdzv.run_id, rdzv.prefix)
    ttl = conf.keep_alive_interval * conf.keep_alive_max_attempt
    try:
        job = await job_lease(store, keys.job, 2 * ttl, store.lease)
        # from now on an outage (an election) is waited out, up to read_timeout, and said
        gateway.retry_for = conf.read_timeout
        gateway.say = lambda line: deps.console.say(f"rendezvous {rdzv.run_id}: {line}")
        addr = spec.local_addr or store.local_address or "127.0.0.1"
        port = await deps.worker_store.start(addr, 0)
        member = await Member.join(store, keys, _node_info(spec, addr, is_host=False), ttl, job)
    except StoreUnavailable as exc:
        await store.close()
        tried = ", ".join(map(str, rdzv.etcd_endpoints))
        raise LauncherError(f"rendezvous {rdzv.run_id}: cannot use etcd ({tried}): {exc}") from None
    except BaseException:
        await store.close()
        raise
    return _Session(store, member, addr, shared=store, master=(addr, port))


async def _lead(spec: LaunchSpec, deps: AgentDeps, session: _Session) -> None:
    """On a shared store: campaign, and once elected (now or when the coordinator is lost), coordinate."""
    member = session.member
    assert member.job is not None
    await campaign(session.store, member.keys.coordinator, member.info.id, member.lease)
    if member.lease.lost.is_set():
        return
    shared, job, me = session.shared, member.job.id, member.info.id.encode()
    assert shared is not None

    async def fence(key: str, value: bytes) -> bool:
        return await shared.put_if_held(key, value, lease=job, holder_key=member.keys.coordinator, holder=me)

    ttl = member.lease.ttl
    coordinator = Coordinator(session.store, member.keys, _settings(spec), master=lambda: session.master,
                              before_round=deps.worker_store.reset, leader=member.info.id, lease=job, fence=fence,
                              why_gone=lambda _key: f"its etcd lease ended (no keep-alive for {ttl:g} s, or it left)")
    session.coordinator = coordinator
    try:
        await coordinator.run()
    except NotCoordinator:  # deposed (its lease ended while it was stopped): the rounds notice and exit
        session.coordinator = None


async def _remove_the_jobs_keys(session: _Session, keep_closed_for: float) -> None:
    """The job is over and every node has left: delete its keys but ``closed``, which turns late nodes away
    for ``keep_closed_for`` seconds (join_timeout: a late node would have waited that long) on a lease of its own."""
    assert session.shared is not None
    keys = session.member.keys
    with contextlib.suppress(StoreUnavailable):
        entry = await session.shared.get(keys.closed)
        marker = await session.shared.grant(keep_closed_for)
        await session.shared.put(keys.closed, entry.value if entry else b"{}", lease=marker.id)
        await session.shared.delete_prefix(keys.root, keep=keys.closed)


async def _try_to_host(
    spec: LaunchSpec, deps: AgentDeps, host: str, port: int
) -> tuple[SharedListener, StoreServer, MemoryStore, int] | None:
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
    server = StoreServer(memory, spec.secret)
    listener = SharedListener(server, deps.worker_store)
    try:
        bound = await listener.start(host, port)
    except StoreError as exc:
        cause = exc.__cause__
        not_ours = isinstance(cause, OSError) and cause.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL)
        await memory.close()
        if must or not not_ours:
            raise
        return None  # another agent on this machine hosts it, or the address is not this machine's: join it
    return listener, server, memory, bound


async def _connect(spec: LaunchSpec, deps: AgentDeps, host: str, port: int) -> StoreClient:
    """Reach the host, retrying (with backoff, saying why every few seconds) until join_timeout."""
    rdzv = spec.rendezvous
    loop = asyncio.get_running_loop()
    deadline = loop.time() + rdzv.conf.join_timeout
    pause, said = CONNECT_RETRY[0], loop.time()
    while True:
        try:
            return await StoreClient.connect(host, port, spec.secret, spec.local_addr, _liveness(spec))
        except StoreUnavailable as exc:
            if "authentication" in str(exc) or "secret" in str(exc) or loop.time() + pause > deadline:
                raise
            if loop.time() - said >= PROGRESS_EVERY:
                waited = loop.time() - (deadline - rdzv.conf.join_timeout)
                deps.console.say(f"{exc}; retrying (waited {waited:.0f} s of {rdzv.conf.join_timeout:.0f})")
                said = loop.time()
        await asyncio.sleep(pause)  # no event announces a host that is not listening yet: retry with backoff
        pause = min(pause * 2, CONNECT_RETRY[1])


def _liveness(spec: LaunchSpec) -> Liveness:
    conf = spec.rendezvous.conf
    return Liveness.of_lease(conf.keep_alive_interval, conf.keep_alive_max_attempt)


def _node_info(spec: LaunchSpec, addr: str, *, is_host: bool) -> NodeInfo:
    rdzv = spec.rendezvous
    static_rank = rdzv.node_rank if isinstance(rdzv, StaticRendezvous) else None
    node_id = f"{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}"
    return NodeInfo(node_id, 0, spec.worker.nproc, spec.worker.role, addr, socket.gethostname(), static_rank, is_host)


async def _let_the_others_leave(session: _Session, timeout: float, deps: AgentDeps) -> bool:
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
            deps.console.say(f"rendezvous: the job has ended; waiting up to {timeout:.0f} s "
                             f"for {len(left)} other node(s) to leave")
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


async def _close(session: _Session) -> None:
    if session.shared is not None:
        await session.shared.close()
    if session.client is not None:
        await session.client.close()
    if session.listener is not None:
        await session.listener.close()
    if session.server is not None:
        await session.server.close()
    if session.memory is not None:
        await session.memory.close()


# --------------------------------------------------------------------------- the rounds


async def _rounds(spec: LaunchSpec, deps: AgentDeps, stops: StopStream, logs: RunLogs, session: _Session) -> Outcome:
    member = session.member
    extra = await _collective_env(spec, deps, session.address)
    previous, attempt, restarts = 0, -1, 0
    last: AttemptResult | None = None
    spare_said = False
    while True:
        word = await _wait_for_word(spec, deps, stops, member, previous)
        if isinstance(word, Interrupted):
            deps.console.say(f"received {signal_name(word.signum)} while waiting for the rendezvous; exiting")
            return Outcome(EXIT_SIGNAL_BASE + word.signum, restarts)
        if isinstance(word, Ended):
            return _ended(spec, deps, word, last, spare=attempt < 0)
        if isinstance(word, Spare):
            if not spare_said:
                deps.console.say(f"rendezvous {spec.rendezvous.run_id}: the job is full ({spec.rendezvous.max_nodes} nodes); "
                                 "this node waits as a spare")
                spare_said = True
            previous = word.round
            continue
        signum = _drop_stale_regroups(stops)
        if signum is not None:
            return Outcome(EXIT_SIGNAL_BASE + signum, restarts)
        attempt += 1
        restarts = word.restarts
        plan = AttemptPlan(attempt, word.restarts, _membership(spec, word), extra)
        last = await _run_round(spec, deps, stops, logs, member, word, plan)
        outcome = last.outcome
        if outcome.interrupted_by is not None:
            return Outcome(EXIT_SIGNAL_BASE + outcome.interrupted_by, restarts)
        if member.lease.lost.is_set():
            raise LauncherError(f"rendezvous {spec.rendezvous.run_id}: this node lost its place in the job: "
                                f"{_why_lost(spec, member)}; workers stopped")
        if outcome.regrouped is not None:
            deps.console.say(f"rendezvous {spec.rendezvous.run_id}: round {word.round} stopped: {outcome.regrouped}")
        else:  # the workers ended by themselves: say how
            await member.report(word.round, not outcome.failed, _summary(last, deps.host) if outcome.failed else "")
        previous = word.round


def _ended(spec: LaunchSpec, deps: AgentDeps, word: Ended, last: AttemptResult | None, *, spare: bool) -> Outcome:
    end = word.word
    if spare:
        deps.console.say(f"rendezvous {spec.rendezvous.run_id}: the job ended "
                         f"({'succeeded' if end.ok else 'failed'}) while this node waited as a spare")
        return Outcome(EXIT_SUCCESS, end.restarts)
    if end.ok:
        return Outcome(EXIT_SUCCESS, end.restarts)
    if end.stranded:  # not the workers' failure: the job could not go on with the nodes left
        raise LauncherError(f"rendezvous {spec.rendezvous.run_id}: the job ended: {end.reason}")
    return Outcome(EXIT_WORKERS_FAILED, end.restarts, last, end.cause or end.reason)


def _drop_stale_regroups(stops: StopStream) -> int | None:
    """Before a round: a Regroup queued for the previous round (its workers ended first) must not stop this one.

    Returns a pending signal, if one is queued (the job is to stop instead).
    """
    while (stop := stops.take_pending()) is not None:
        if isinstance(stop, Interrupted):
            return stop.signum
    return None


async def _wait_for_word(
    spec: LaunchSpec, deps: AgentDeps, stops: StopStream, member: Member, previous: int
) -> Assignment | Spare | Ended | Interrupted:
    """The next word from the coordinator, or a signal; bounded by join_timeout, with a progress line every 5 s."""
    rdzv = spec.rendezvous
    progress = asyncio.create_task(_progress(spec, deps, member))
    try:
        async with asyncio.timeout(rdzv.conf.join_timeout):
            while True:
                index, value = await first_of(member.next_round(previous), stops.arrived(), member.lease.lost.wait())
                if index == 0:
                    return value  # type: ignore[no-any-return]
                if index == 1:
                    stop = stops.take_pending()
                    if isinstance(stop, Interrupted):
                        return stop
                    continue  # a regroup between rounds changes nothing: we are waiting for the next one anyway
                raise LauncherError(f"rendezvous {rdzv.run_id}: lost its place while waiting: {_why_lost(spec, member)}")
    except TimeoutError:
        raise LauncherError(await _timeout_message(spec, member)) from None
    except StoreUnavailable as exc:
        raise LauncherError(f"rendezvous {rdzv.run_id}: {exc}") from exc
    finally:
        progress.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await progress


def _why_lost(spec: LaunchSpec, member: Member) -> str:
    if member.lease.why:
        return member.lease.why
    rdzv = spec.rendezvous
    conf = rdzv.conf
    if on_etcd(rdzv):
        ttl = conf.keep_alive_interval * conf.keep_alive_max_attempt
        return (f"its etcd lease expired (no keep-alive reached etcd for {ttl:g} s: keep_alive_interval x "
                "keep_alive_max_attempt; was this agent stopped or starved?)")
    host, port = _endpoint(spec)
    return f"its lease expired or the connection to the host at {host}:{port} was lost"


async def _progress(spec: LaunchSpec, deps: AgentDeps, member: Member) -> None:
    rdzv = spec.rendezvous
    loop = asyncio.get_running_loop()
    started = loop.time()
    while True:
        await asyncio.sleep(PROGRESS_EVERY)  # a report to the user, not a wait for state: waiting is on watches
        with contextlib.suppress(StoreUnavailable):
            status = await member.status()
            shown = status.get("names", [])
            names = ", ".join(shown) + (", ..." if status.get("joined", 0) > len(shown) else "")
            deps.console.say(f"rendezvous {rdzv.run_id}: {status.get('joined', 0)}/{rdzv.max_nodes} nodes joined "
                             f"(min {rdzv.min_nodes}, max {rdzv.max_nodes}), waiting {loop.time() - started:.0f} s"
                             + (f"; joined: {names}" if names else ""))


async def _timeout_message(spec: LaunchSpec, member: Member) -> str:
    rdzv = spec.rendezvous
    text = f"rendezvous {rdzv.run_id}: timed out after {rdzv.conf.join_timeout:.0f} s (join_timeout) waiting for the other nodes"
    with contextlib.suppress(StoreUnavailable):
        status = await member.status()
        wanted = str(rdzv.min_nodes) if rdzv.min_nodes == rdzv.max_nodes else f"{rdzv.min_nodes}-{rdzv.max_nodes}"
        text += f": {status.get('joined', '?')} of {wanted} joined"
        if isinstance(rdzv, StaticRendezvous):
            missing = sorted(set(range(rdzv.nodes)) - set(status.get("static_ranks", [])))
            text += f"; node ranks never seen: {', '.join(map(str, missing))}"
    return text


def _membership(spec: LaunchSpec, word: Assignment) -> Membership:
    return Membership(word.round, word.group_rank, word.group_world_size, spec.worker.nproc, word.ranks, word.master_addr,
                      word.master_port)


async def _collective_env(spec: LaunchSpec, deps: AgentDeps, address: str) -> tuple[tuple[str, str], ...]:
    """GLOO/NCCL_SOCKET_IFNAME when this host's name resolves to loopback but the rendezvous runs over a real address."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(socket.gethostname(), None, family=socket.AF_INET)
        hostname_address = str(infos[0][4][0])
    except (OSError, IndexError):
        return ()
    interface = await loop.run_in_executor(None, interface_of, address) if not is_loopback(address) else None
    extra = collective_interface(spec.base_env, address, hostname_address, interface)
    if extra:
        deps.console.say(f"this host's name resolves to {hostname_address}: the workers get "
                         f"GLOO_SOCKET_IFNAME=NCCL_SOCKET_IFNAME={interface}, the interface of {address}")
    return tuple(sorted(extra.items()))


async def _run_round(  # noqa: PLR0917 - private; the pieces _rounds holds
    spec: LaunchSpec, deps: AgentDeps, stops: StopStream, logs: RunLogs, member: Member, word: Assignment, plan: AttemptPlan
) -> AttemptResult:
    watcher = asyncio.create_task(_stop_when_the_round_moves_on(member, word.round, stops))
    try:
        return await run_attempt(spec, plan, logs.attempt_dir(plan.attempt, spec.worker.nproc), deps, stops)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


async def _stop_when_the_round_moves_on(member: Member, round_: int, stops: StopStream) -> None:
    """Turn "the round is over" (or "this node lost its lease") into a Regroup stop for the running workers."""
    try:
        index, value = await first_of(member.round_changed(round_), member.lease.lost.wait())
        reason = (value.reason or value.phase) if index == 0 else "this node's lease was lost"
    except StoreUnavailable as exc:
        reason = str(exc)
    stops.regroup(reason)


def _summary(result: AttemptResult, host: str) -> str:
    """This node's first failure in a few lines, for the other nodes' reports."""
    root = root_cause(result.results)
    if root is None:
        return f"a worker on {host} failed"
    _, text = exception_text(root)
    lines = text.split("\n")
    head = f"rank {root.rank} (local_rank {root.local_rank}) on {host}, pid {root.pid}: {describe_status(root.status)}"
    return "\n".join([head, *lines[-12:]])
