"""Several nodes: round after round until the job ends, in a session (``rendezvous.session``) that hosts or joins.

The session owns the backend (hosting the embedded store, joining it, or etcd) and this node's
``Member``; this module only runs the rounds. The loop::

    join → wait for my assignment (bounded by join_timeout, a progress line every 5 s)
         → --health-check (rounds after the first), --network-check (``rendezvous.netcheck``: this node measures its
           ring neighbour, and waits for the coordinator's verdict; a node found unhealthy: wait for the next word)
         → attempt, stopped early when the round key moves on (a node joined or left, another
           node's workers failed) or this node's lease is lost
         → report how my workers ended → wait for the next word: a new round, or the end

Restarts are decided by the coordinator for the whole job (one budget); every node ends with the
same outcome and the job's first failure in its report. The coordinator's word that starts a round (or ends the
job) also says what ended the round before: the first failure's root cause and the nodes lost, which every node
emits to its event stream (``node.lost``, ``failure``, then ``restart`` when the restarts counted went up), before the
new round's ``rdzv.round``. Every word also lists the nodes the job has excluded so far: each node emits
``node.excluded`` once for each, the first time it hears of it (even when it skipped the round that excluded it).

A node whose ``--health-check`` fails before it joins says so in its join (``NodeInfo.unhealthy``): the coordinator
excludes it before any round can count it, and on etcd it does not campaign. A node the coordinator excluded (blamed
for ``--max-node-failures`` failures, or unhealthy) reads it on its assign key
and leaves with exit code 4 (``NodeExcluded``), a line naming why; the node hosting the job's store (or coordinating
it, on etcd) cannot leave without ending the job, so it keeps serving without workers until the job ends, and leaves
with the job's exit code.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

from rankrun.agent import relays
from rankrun.agent.attempt import AttemptResult, Outcome, run_attempt
from rankrun.agent.deps import AgentDeps
from rankrun.agent.events import first_error, first_of
from rankrun.agent.facts import failure, failure_from, failure_line, failure_value
from rankrun.agent.gate import excluded as excluded_line
from rankrun.agent.gate import unhealthy
from rankrun.agent.lines import interrupted_line
from rankrun.agent.plan import AttemptPlan, Membership
from rankrun.agent.relays import NodeRelay
from rankrun.agent.stall import show
from rankrun.agent.watch import WAITING
from rankrun.errors import LauncherError, NodeExcluded, StoreError
from rankrun.events.records import NodeExcluded as ExcludedFact
from rankrun.events.records import NodeLost, RdzvRound, Restart
from rankrun.fdlimit import job_fits, listen_fits, relay_budget
from rankrun.health.outliers import Link
from rankrun.logs.layout import RunLogs
from rankrun.netif import collective_interface, interface_of, is_loopback
from rankrun.proc.signals import Interrupted, StopStream
from rankrun.rendezvous import netcheck
from rankrun.rendezvous.keys import Assignment, Excluded, RoundWord, Spare
from rankrun.rendezvous.member import Ended, Member, wall_time
from rankrun.rendezvous.session import Session, open_session
from rankrun.report.failure import describe_status, exception_text, root_cause, signal_name
from rankrun.spec import DynamicRendezvous, EntryKind, LaunchSpec, StaticRendezvous, on_etcd, rendezvous_name
from rankrun.stacks.exchange import Exchange
from rankrun.store.api import StoreUnavailable

if TYPE_CHECKING:
    from rankrun.agent.straggle_job import JobStragglers
    from rankrun.api.node import ApiNode
    from rankrun.rendezvous.coordinator import Coordinator

PROGRESS_EVERY = 5.0  # seconds between "3/4 nodes joined" lines while waiting


async def run_multinode(spec: LaunchSpec, deps: AgentDeps, stops: StopStream, logs: RunLogs, *,
                        begin: Callable[[str], Awaitable[None]] | None = None) -> Outcome:
    """The job on this node, round after round; ``begin``: told this node's address once the session is open (the
    job's observers start there)."""
    joined = asyncio.get_running_loop().time()
    rdzv = spec.rendezvous
    assert isinstance(rdzv, StaticRendezvous | DynamicRendezvous)
    etcd = on_etcd(rdzv)
    if not etcd and spec.secret is None:
        deps.console.say(f"{rendezvous_name(rdzv.run_id)}: no secret (RANKRUN_RDZV_SECRET or --rdzv-conf secret_file=PATH): "
                         "any host that can reach the endpoint can join this job")
    sick = await unhealthy(spec, deps, stops)  # --health-check before the first round, before joining
    said = f"health check: {sick}" if sick is not None else None  # in the join itself: never counted in a round
    opened = asyncio.get_running_loop().time()  # join_timeout counts from here: reaching the host is part of joining
    try:
        async with open_session(spec, deps.worker_store, deps.console.say, backend=deps.rendezvous,
                                unhealthy=said) as session:
            if etcd and rdzv.conf.user is None and rdzv.conf.ssl_cert is None:  # etcd's own users or certificates guard it
                deps.console.say(f"{rendezvous_name(rdzv.run_id)}: etcd without a user or client certificate (--rdzv-conf user=, "
                                 "password_file= or ssl_cert=, ssl_cert_key=): whoever can reach etcd can join this job")
            if begin is not None:
                await begin(session.member.info.addr or session.address)
            relay = NodeRelay(spec, deps.console.say, hosting=session.coordinator is not None and not etcd,
                              address=session.member.info.addr or session.address)
            try:
                async with _probe_endpoint(spec, session) as probe:
                    return await _rounds(spec, deps, stops, logs, session, joined, sick=sick, probe=probe, relay=relay,
                                         opened=opened)
            finally:
                await relay.close()
    except BaseExceptionGroup as failed:  # a background task failed: that error, not a group, is what the user sees
        raise first_error(failed) from None


# --------------------------------------------------------------------------- the rounds


async def _rounds(  # noqa: PLR0917 - private; what run_multinode holds
    spec: LaunchSpec, deps: AgentDeps, stops: StopStream, logs: RunLogs, session: Session, joined: float, *,
    sick: str | None = None, probe: tuple[str, int] | None = None, relay: NodeRelay | None = None,
    opened: float | None = None,
) -> Outcome:
    """``sick``: why this node said it is unhealthy (its --health-check): it runs no workers, and waits to be told;
    a job that ends first (the others' workers were quick) ends it as excluded all the same. ``probe``: where this
    node's probe endpoint listens (``--network-check``). ``opened``: when it set out to join (join_timeout's start)."""
    member = session.member
    loop = asyncio.get_running_loop()
    extra = await _collective_env(spec, deps, session.address)
    previous, attempt, restarts = 0, -1, 0
    last: AttemptResult | None = None
    placed: Assignment | None = None  # this node's place in the last round it ran
    api = _api_node(spec, deps, logs, member)
    spare_said = False
    excluded: dict[str, str] = {}  # every exclusion this node has heard of: name → why (for its failure report)
    while True:
        word = await _wait_for_word(spec, deps, stops, session, previous, sick=sick,
                                    since=opened if previous == 0 else None)
        if isinstance(word, Interrupted):
            deps.console.say(f"received {signal_name(word.signum)} while waiting for the rendezvous; exiting")
            return Outcome.signalled(word.signum, restarts)
        if isinstance(word, Excluded | Ended):
            out = _left_out(word, session, sick)
            if out is not None:
                return await _excluded(spec, deps, stops, session, out, restarts, excluded)
            if placed is not None and word.word.round == placed.round:  # what ended this node's round, if not told
                _tell(deps, word.word, attempt)
            _tell_excluded(deps, word.word, excluded)
            # a spare was never given a place; a node whose place came as another node's failure ended the job (it
            # never got to start its workers) failed with the job
            return await _ended(spec, deps, word, last, api, placed, excluded=excluded,
                                spare=attempt < 0 and not word.placed and word.word.round > 0)  # 0: none formed
        if isinstance(word, Spare) or sick is not None:  # sick (a later round's check): never run workers
            spare_said = spare_said or (isinstance(word, Spare) and _say_spare(spec, deps))
            previous = word.round
            continue
        if attempt >= 0 and (sick := await _recheck(spec, deps, stops, member)) is not None:
            previous = word.round  # --health-check before every round after the first (all nodes at once); sick:
            continue  # not this round's, which the coordinator re-forms without it
        if (probe is not None and word.group_world_size >= netcheck.MIN_NODES
                and not await _network_check(spec, deps, stops, session, word, probe)):
            previous = word.round  # the check found a node unhealthy (or the round moved on): the next word says
            continue  # what comes next, this node's exclusion or the round without it
        pending = stops.take_pending()  # a signal that came as the word did (or during the check): the job stops
        if pending is not None:
            return _stopped(deps, f"received {signal_name(pending.signum)} as round {word.round} formed; exiting",
                            pending.signum, restarts)
        told = news(placed, word, restarts, member.word)
        _tell(deps, told, attempt, spec.restart.max_restarts - word.restarts if word.restarts > restarts else None)
        _tell_excluded(deps, member.word, excluded)
        took = round(loop.time() - joined, 6)
        deps.events.emit(RdzvRound(word.round, word.group_world_size, word.ranks.world_size, word.group_rank, took))
        attempt += 1
        restarts = word.restarts
        master = await relay.master(word) if relay is not None else (word.master_addr, word.master_port)
        plan = AttemptPlan(attempt, word.restarts, _membership(spec, word, master), extra, rendezvous=took)
        placed = word
        last = await _run_round(spec, deps, stops, logs, member, word, plan, judge=session.coordinator)
        outcome = last.outcome
        if outcome.interrupted_by is not None:  # said on every node that received it, as one node says it
            return _stopped(deps, interrupted_line(outcome.interrupted_by, outcome.second_signal, last.results),
                            outcome.interrupted_by, restarts)
        if member.lease.lost.is_set():
            raise LauncherError(f"{rendezvous_name(spec.rendezvous.run_id)}: this node lost its place in the job: "
                                f"{session.why_lost()}; workers stopped")
        await _round_over(spec, deps, member, api, word, last, attempt)
        previous = word.round
        joined = loop.time()  # the next round's time counts from here


def _stopped(deps: AgentDeps, line: str, signum: int, restarts: int) -> Outcome:
    """A signal this node received ends its part of the job: it says so (``line``), as every node that got it does."""
    deps.console.say(line)
    return Outcome.signalled(signum, restarts)


def _say_fd_short(spec: LaunchSpec, deps: AgentDeps, word: Assignment) -> None:
    """The host of this round's workers' store (and, embedded, of the rendezvous) says if it cannot hold them."""
    nodes = 0 if on_etcd(spec.rendezvous) else word.group_world_size  # etcd holds the nodes' connections, not this process
    if relays.wanted(spec, word):  # the other nodes relay: this host holds one connection per node, and its own workers'
        for line in relay_budget(world_size=word.ranks.world_size, nodes=nodes, local_workers=spec.worker.nproc,
                                 asked=spec.store.relays is True):
            deps.console.say(line)
        return
    for short in (job_fits(world_size=word.ranks.world_size, nodes=nodes, local_workers=spec.worker.nproc),
                  listen_fits(world_size=word.ranks.world_size)):
        if short is not None:
            deps.console.say(short)


async def _round_over(  # noqa: PLR0917 - private; what _rounds holds
    spec: LaunchSpec, deps: AgentDeps, member: Member, api: ApiNode | None, word: Assignment,
    last: AttemptResult, attempt: int,
) -> None:
    """This node's workers of ``word``'s round are gone: say how they ended."""
    outcome = last.outcome
    if outcome.regrouped is not None:
        deps.console.say(f"{rendezvous_name(spec.rendezvous.run_id)}: round {word.round} stopped: {outcome.regrouped}")
    else:  # the workers ended by themselves: say how
        if api is not None:  # rankrun.launch: this node's values, or failures, for the others
            await api.report(word, outcome.failed, last.results)
        await member.report(word.round, not outcome.failed, _summary(last, deps.host) if outcome.failed else "",
                            _root(last, attempt, deps.events.node) if outcome.failed else None,
                            stall=outcome.stalled, blame=outcome.stall_blame)


def news(placed: Assignment | None, word: Assignment, restarts: int, latest: RoundWord | None) -> RoundWord | None:
    """What to tell of how this node's last round ended (pure): ``latest``, the word that came with ``word``, whose
    news is what ended the round before it, when that round was the one this node ran (``placed``), or when a
    restart was counted since ``restarts``: a node still stopping its workers may skip a round that failed at once,
    and its restart (and that failure) must not go untold. None when this node ran no round yet, or only regroups
    came between."""
    if placed is None:
        return None
    return latest if word.round == placed.round + 1 or word.restarts > restarts else None


async def _recheck(spec: LaunchSpec, deps: AgentDeps, stops: StopStream, member: Member) -> str | None:
    """``--health-check`` before a round after the first; an unhealthy node says so, to be excluded (its reason)."""
    sick = await unhealthy(spec, deps, stops)
    if sick is not None:
        await member.report_unhealthy(f"health check: {sick}")
    return sick


@contextlib.asynccontextmanager
async def _probe_endpoint(spec: LaunchSpec, session: Session) -> AsyncIterator[tuple[str, int] | None]:
    """``--network-check``: this node's probe endpoint (``health.probe``), on the address it advertises, answering
    only this job's agents (its secret), for the session's life; None without the check."""
    if not spec.health.network:
        yield None
        return
    from rankrun.health.probe import ProbeServer  # noqa: PLC0415 - a job with --network-check only

    addr = session.member.info.addr or session.address
    server = ProbeServer(addr, spec.secret)
    try:
        port = await server.start()
    except StoreError as exc:
        raise LauncherError(f"--network-check: {exc}") from None
    try:
        yield addr, port
    finally:
        await server.close()


async def _network_check(  # noqa: PLR0917 - private; what _rounds holds
    spec: LaunchSpec, deps: AgentDeps, stops: StopStream, session: Session, word: Assignment, probe: tuple[str, int]
) -> bool:
    """This node's part of its round's network check (``rendezvous.netcheck``): whether it starts its workers. False
    when the check found a node unhealthy (this one or another: the coordinator re-forms the round without it) or the
    round moved on meanwhile; True when nobody was, when no verdict came within ``verdict_wait`` (said), or when a
    stop came (the caller's pending stop then ends the job)."""
    from rankrun.health.probe import ProbeError, measure  # noqa: PLC0415 - a job with --network-check only

    member, run_id = session.member, spec.rendezvous.run_id

    async def one(addr: str, port: int) -> Link | None:
        try:
            return await measure(addr, port, spec.secret, size=netcheck.SIZE, pings=netcheck.PINGS,
                                 timeout=netcheck.MEASURE_TIMEOUT)
        except ProbeError as exc:
            deps.console.say(f"{rendezvous_name(run_id)}: network check: {exc}")
            return None

    reach = netcheck.reach(spec.health.timeout if spec.health.check is not None else None)
    bound = netcheck.verdict_wait(reach)
    part = netcheck.take_part(member.store, member.keys, word.round, word.group_rank, word.group_world_size,
                              endpoint=probe, measure=one, lease=member.lease.id, endpoint_wait=reach)
    try:
        async with asyncio.timeout(bound):
            index, verdict = await first_of(part, member.round_changed(word.round), stops.arrived())
    except TimeoutError:
        deps.console.say(f"{rendezvous_name(run_id)}: round {word.round}'s network check gave no verdict within "
                         f"{bound:g} s; starting the workers")
        return True
    except StoreUnavailable as exc:
        raise LauncherError(f"{rendezvous_name(run_id)}: {exc}") from exc
    if index != 0:
        return index == 2
    return not verdict


def _say_spare(spec: LaunchSpec, deps: AgentDeps) -> bool:
    deps.console.say(f"{rendezvous_name(spec.rendezvous.run_id)}: the job is full ({spec.rendezvous.max_nodes} nodes); "
                     "this node waits as a spare")
    return True


def _tell(deps: AgentDeps, word: RoundWord | None, attempt: int, restarts_left: int | None = None) -> None:
    """What ended this node's round ``attempt``, as the coordinator says it to every node (``word``; None: nothing
    this node ran): the nodes lost, the job's first failure (its root cause), and the restart (``restarts_left``:
    when one was counted)."""
    if word is None:
        return
    if word.lost:
        deps.events.emit(NodeLost(word.lost, word.reason))
    fact = failure_from(word.failure, attempt) if word.failure is not None else None
    if fact is not None:
        deps.events.emit(fact)
    if restarts_left is not None:  # the root cause says more than the coordinator's "node N reported a failure"
        deps.events.emit(Restart(attempt + 1, failure_line(fact) if fact is not None else word.reason, restarts_left))


def _tell_excluded(deps: AgentDeps, word: RoundWord | None, heard: dict[str, str]) -> None:
    """A ``node.excluded`` for each exclusion in ``word`` this node has not heard of yet (added to ``heard``)."""
    for name, why in word.excluded if word is not None else ():
        if name not in heard:
            heard[name] = why
            deps.events.emit(ExcludedFact((name,), why))


def _left_out(word: Excluded | Ended, session: Session, sick: str | None) -> Excluded | None:
    """This node's exclusion, if ``word`` tells one: its own key's word, its failed health check, or the job's end that
    names it (the job may end on a node's exclusion before that node reads its own key; a host serves to the end)."""
    if isinstance(word, Excluded):
        return word
    if sick is not None:
        return Excluded(f"unhealthy: health check: {sick}", time.time())
    info = session.member.info
    names = {info.id, info.name}  # the coordinator names a node it has no key for by its id
    why = next((why for name, why in word.word.excluded if name in names), None)
    return Excluded(why, time.time()) if why is not None and session.coordinator is None else None


def _root(result: AttemptResult, attempt: int, node: str) -> dict[str, object] | None:
    """This node's root cause, for the coordinator to tell every node (None for a stall: no rank failed; the stall's
    cause and blame travel in the result's own keys, ``Member.report``)."""
    root = root_cause(result.results)
    return failure_value(failure(root, attempt, node)) if root is not None else None


async def _excluded(  # noqa: PLR0917 - private; what _rounds holds
    spec: LaunchSpec, deps: AgentDeps, stops: StopStream, session: Session, word: Excluded, restarts: int,
    heard: dict[str, str],
) -> Outcome:
    """This node is out of the job for good: it leaves with exit code 4, or, when the job's store (the embedded host) or
    its coordination (etcd) is here, serves the job without workers until it ends, and leaves with its exit code;
    meanwhile each later exclusion is a ``node.excluded`` here too (``heard``: those already told)."""
    member, run_id = session.member, spec.rendezvous.run_id
    me = f"this node ({deps.host}, {member.info.addr})"
    if session.coordinator is None:
        raise NodeExcluded(f"{me} is excluded from job {run_id}: {word.reason}; drain it or reschedule elsewhere")
    deps.console.say(f"{me} is excluded from job {run_id} since {wall_time(word.at)}: {word.reason}; it keeps serving "
                     "the rendezvous and the workers' store, without workers, until the job ends")
    deps.on_demand.idle(run_id, WAITING)
    while True:
        index, value = await first_of(member.wait_for_end(lambda w: _tell_excluded(deps, w, heard)), stops.arrived(),
                                      member.lease.lost.wait())
        if index == 1:
            stop = stops.take_pending()
            if stop is None:
                continue  # another consumer took it first
            deps.console.say(f"received {signal_name(stop.signum)} while serving the job without workers; exiting")
            return Outcome.signalled(stop.signum, restarts)
        if index == 2:
            raise LauncherError(f"{rendezvous_name(run_id)}: lost its place while serving the job: {session.why_lost()}")
        end: RoundWord = value
        _tell_excluded(deps, end, heard)
        break
    deps.console.say(f"{rendezvous_name(run_id)}: the job ended ({'succeeded' if end.ok else 'failed'}); this node served it "
                     f"without workers: excluded: {word.reason}")
    if end.ok:
        return Outcome.succeeded(end.restarts)
    if end.stranded:
        raise LauncherError(f"{rendezvous_name(run_id)}: the job ended: {end.reason}")
    return Outcome.failed(end.restarts, None, end.cause or end.reason, excluded=dict(end.excluded))


async def _ended(  # noqa: PLR0917 - private; what _rounds holds
    spec: LaunchSpec, deps: AgentDeps, word: Ended, last: AttemptResult | None, api: ApiNode | None,
    placed: Assignment | None, *, spare: bool, excluded: dict[str, str],
) -> Outcome:
    if api is not None:  # rankrun.launch: the other nodes' values, or failures, before leaving
        await api.job_ended(word.word, placed, deps.console.say)
    end = word.word
    if spare:
        deps.console.say(f"{rendezvous_name(spec.rendezvous.run_id)}: the job ended "
                         f"({'succeeded' if end.ok else 'failed'}) while this node waited as a spare")
        return Outcome.succeeded(end.restarts)
    if end.ok:
        return Outcome.succeeded(end.restarts)
    if end.stranded:  # not the workers' failure: the job could not go on with the nodes left
        raise LauncherError(f"{rendezvous_name(spec.rendezvous.run_id)}: the job ended: {end.reason}")
    return Outcome.failed(end.restarts, last, end.cause or end.reason, excluded=excluded)


def _api_node(spec: LaunchSpec, deps: AgentDeps, logs: RunLogs, member: Member) -> ApiNode | None:
    """A ``rankrun.launch`` job's exchange of values and failures between nodes; None for any other job."""
    results = spec.worker.entry.api_results
    if results is None:
        return None
    from rankrun.api.node import ApiNode  # noqa: PLC0415 - the API's jobs only

    spill_dir = logs.base / "values" if logs.base is not None and not logs.temporary else None
    return ApiNode(member, results, nproc=spec.worker.nproc, host=deps.host, address=_host(deps, member),
                   spill_dir=spill_dir, run_id=spec.rendezvous.run_id, close_timeout=spec.rendezvous.conf.close_timeout)


def _host(deps: AgentDeps, member: Member) -> str:
    """This node as reports name it: two nodes may share a host name, so with its address."""
    return f"{deps.host}/{member.info.addr}" if member.info.addr else deps.host


async def _wait_for_word(
    spec: LaunchSpec, deps: AgentDeps, stops: StopStream, session: Session, previous: int, *, sick: str | None = None,
    since: float | None = None,
) -> Assignment | Spare | Ended | Interrupted:
    """The next word from the coordinator, or a signal; bounded by join_timeout, with a progress line every 5 s.
    ``sick``: this node's failed check; a node that no coordinator excluded by join_timeout (none was elected: it
    does not stand itself) leaves as unhealthy all the same, exit 4, not as a rendezvous that timed out.
    ``since``: the first round's wait counts from when this node set out to join (reaching the host is part of it),
    except on the node that coordinates, whose coordinator ends the job for every node at join_timeout after it
    began (``round._first_wait``): its own bound, from now, comes after that."""
    rdzv = spec.rendezvous
    member = session.member
    bound = rdzv.conf.join_timeout
    if since is not None and session.coordinator is None:
        bound = max(0.0, bound - (asyncio.get_running_loop().time() - since))
    deps.on_demand.idle(rdzv.run_id, WAITING)  # what rankrun --stacks says meanwhile
    progress = asyncio.create_task(_progress(spec, deps, member))
    try:
        async with asyncio.timeout(bound):
            while True:
                index, value = await first_of(member.next_round(previous), stops.arrived(), member.lease.lost.wait())
                if index == 0:
                    return value  # type: ignore[no-any-return]
                if index == 1:
                    stop = stops.take_pending()
                    if stop is not None:
                        return stop
                    continue  # another consumer took it first
                raise LauncherError(f"{rendezvous_name(rdzv.run_id)}: lost its place while waiting: {session.why_lost()}")
    except TimeoutError:
        if sick is not None:
            raise NodeExcluded(excluded_line(deps.host, rdzv.run_id, sick)) from None
        raise LauncherError(await _timeout_message(spec, member)) from None
    except StoreUnavailable as exc:
        raise LauncherError(f"{rendezvous_name(rdzv.run_id)}: {exc}") from exc
    finally:
        progress.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await progress


async def _progress(spec: LaunchSpec, deps: AgentDeps, member: Member) -> None:
    rdzv = spec.rendezvous
    loop = asyncio.get_running_loop()
    started = loop.time()
    while True:
        await asyncio.sleep(PROGRESS_EVERY)  # a report to the user, not a wait for state: waiting is on watches
        with contextlib.suppress(StoreUnavailable):
            status = await member.status()
            names = ", ".join(status.names) + (", ..." if status.joined > len(status.names) else "")
            deps.console.say(f"{rendezvous_name(rdzv.run_id)}: {status.joined}/{rdzv.max_nodes} nodes joined "
                             f"(min {rdzv.min_nodes}, max {rdzv.max_nodes}), waiting {loop.time() - started:.0f} s"
                             + (f"; joined: {names}" if names else ""))


async def _timeout_message(spec: LaunchSpec, member: Member) -> str:
    rdzv = spec.rendezvous
    text = (f"{rendezvous_name(rdzv.run_id)}: timed out after {rdzv.conf.join_timeout:.0f} s (join_timeout) waiting for "
            "the other nodes")
    with contextlib.suppress(StoreUnavailable):
        status = await member.status()
        wanted = str(rdzv.min_nodes) if rdzv.min_nodes == rdzv.max_nodes else f"{rdzv.min_nodes}-{rdzv.max_nodes}"
        text += f": {status.joined} of {wanted} joined"
        if isinstance(rdzv, StaticRendezvous):
            missing = sorted(set(range(rdzv.nodes)) - set(status.static_ranks))
            text += f"; node ranks never seen: {', '.join(map(str, missing))}"
    return text


def _membership(spec: LaunchSpec, word: Assignment, master: tuple[str, int]) -> Membership:
    """``master``: where this node's workers reach the store (the host's, or this node's relay)."""
    return Membership(word.round, word.group_rank, word.group_world_size, spec.worker.nproc, word.ranks, *master)


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
    spec: LaunchSpec, deps: AgentDeps, stops: StopStream, logs: RunLogs, member: Member, word: Assignment, plan: AttemptPlan,
    *, judge: Coordinator | None = None,
) -> AttemptResult:
    """One round's attempt on this node, with the round's stacks exchange and straggler watch; ``judge``: this node's
    coordinator, if it coordinates: it judges the job's stragglers too."""
    if judge is not None and plan.attempt == 0:  # the host, before its first workers start (said once, not per restart)
        _say_fd_short(spec, deps, word)
    moved_on = _the_round_moved_on(member, word.round)
    exchange = Exchange(member.store, member.keys, member.info.id, word, host=_host(deps, member), run_id=spec.rendezvous.run_id,
                        sample=deps.on_demand.sample, show=lambda lines: show(deps.console, lines),
                        lease=member.lease.id, job_lease=member.job.id if member.job is not None else 0)
    serving = [asyncio.create_task(_serve(exchange))]
    stragglers = _stragglers(spec, deps, member, word, judge=judge)
    if stragglers is not None:
        serving.append(asyncio.create_task(stragglers.run()))
    try:
        with deps.on_demand.round(exchange, stragglers):  # a stall or a --stacks request gets the whole job's stacks
            return await run_attempt(spec, plan, logs.attempt_dir(plan.attempt, spec.worker.nproc), deps, stops, moved_on)
    finally:
        for task in serving:
            task.cancel()
        await asyncio.gather(*serving, return_exceptions=True)


def _stragglers(spec: LaunchSpec, deps: AgentDeps, member: Member, word: Assignment, *,
                judge: Coordinator | None) -> JobStragglers | None:
    """``--straggler-window`` on Python workers: the round's watch of the whole job (``agent.straggle_job``)."""
    if spec.straggler.window <= 0 or spec.worker.entry.kind is EntryKind.BINARY:
        return None
    from rankrun.agent.straggle import Said  # noqa: PLC0415 - with the watch on
    from rankrun.agent.straggle_job import JobStragglers  # noqa: PLC0415

    said = Said(lambda line: show(deps.console, [line]), deps.events)
    return JobStragglers(member.store, member.keys, word.round, member.info.id, word.group_world_size,
                         spec.straggler.window, said, where=_host(deps, member), host=judge is not None,
                         lease=member.lease.id,
                         blame=judge.straggler if judge is not None and spec.straggler.action == "exclude" else None)


async def _serve(exchange: Exchange) -> None:
    """The round's stacks exchange; a store that fails here is the round's business (its watches say so), not this."""
    with contextlib.suppress(StoreUnavailable):
        await exchange.serve()


async def _the_round_moved_on(member: Member, round_: int) -> str:
    """Ends, with why, once the round is over (re-forming, the job ended) or this node lost its lease."""
    try:
        index, value = await first_of(member.round_changed(round_), member.lease.lost.wait())
    except StoreUnavailable as exc:
        return str(exc)
    return (value.reason or value.phase.value) if index == 0 else "this node's lease was lost"


def _summary(result: AttemptResult, host: str) -> str:
    """This node's first failure in a few lines, for the other nodes' reports."""
    if result.outcome.stalled is not None:
        return f"the workers on {host} stalled: {result.outcome.stalled}"
    root = root_cause(result.results)
    if root is None:
        return f"a worker on {host} failed"
    _, text = exception_text(root)
    lines = text.split("\n")
    head = f"rank {root.rank} (local_rank {root.local_rank}) on {host}, pid {root.pid}: {describe_status(root.status)}"
    return "\n".join([head, *lines[-12:]])
