"""Several nodes' round-level features, listed once (``multi_node``), and those that have no module of their own: the
network check, the job's view (stacks exchange and straggler watch), ``rankrun.launch``'s values and this node's
report to the coordinator (the goodput account's share, ``agent.goodput``, is written just before it).
``agent.round`` says when each hook is called; one node's list is ``agent.loop``'s."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from rankrun.agent import store_relay
from rankrun.agent.checkpoint import Keeping, across_nodes
from rankrun.agent.deps import AgentDeps
from rankrun.agent.facts import failure, failure_value
from rankrun.agent.gate import HealthGate, unhealthy
from rankrun.agent.goodput import GoodputShare, JobGoodput
from rankrun.agent.race import first_of
from rankrun.agent.round import Feature, NewsEvents, OpenFiles, Round, Rounds
from rankrun.agent.stall import show
from rankrun.agent.store_relay import NodeStoreRelay
from rankrun.errors import LauncherError, StoreError
from rankrun.netif import collective_interface, interface_of, is_loopback
from rankrun.proc.signals import StopStream
from rankrun.rendezvous import netcheck
from rankrun.report.failure import node_summary, root_cause
from rankrun.spec import EntryKind, LaunchSpec, rendezvous_name
from rankrun.stacks.exchange import Exchange
from rankrun.store.api import StoreUnavailable

if TYPE_CHECKING:
    from rankrun.agent.attempt import AttemptResult
    from rankrun.agent.stragglers.job import JobStragglers
    from rankrun.api.node import ApiNode
    from rankrun.health.outliers import Link
    from rankrun.logs.layout import RunLogs
    from rankrun.rendezvous.keys import Assignment, RoundWord
    from rankrun.rendezvous.member import Member
    from rankrun.rendezvous.session import Session


@contextlib.asynccontextmanager
async def multi_node(spec: LaunchSpec, deps: AgentDeps, stops: StopStream, logs: RunLogs, session: Session, *,
                     sick: str | None, kept: Keeping | None = None,
                     goodput: JobGoodput | None = None) -> AsyncIterator[Rounds]:
    """Several nodes, for the session's life: ``sick``, why this node's check before joining failed; ``kept``, the
    node's keeper of kept progress; ``goodput``, the job's account (shared with the host, before each report)."""
    member = session.member
    address = member.info.addr or session.address
    news = NewsEvents(deps.events)
    gate = HealthGate(lambda: unhealthy(spec, deps, stops), first=False, sick=sick, report=member.report_unhealthy)
    relay = NodeStoreRelay(spec, deps.console.say, hosting=session.hosting, relayable=session.relayable, address=address)
    host = session.coordinator is not None  # the host of the workers' store says if it cannot hold them
    features: list[Feature] = [gate]
    try:
        async with contextlib.AsyncExitStack() as stack:
            probe = await stack.enter_async_context(_probe_endpoint(spec, address))
            if probe is not None:
                features.append(NetworkCheck(spec, deps, stops, session, probe))
            if host:
                features.append(OpenFiles(deps.console.say, spec, nodes=None if session.hosting else 0,
                                          relaying=lambda word: store_relay.wanted(spec, word, relayable=session.relayable)))
            env = WorkerEnv(await _collective_env(spec, deps, session.address))
            progress: list[Feature] = []
            if kept is not None:
                progress.append(await stack.enter_async_context(across_nodes(kept, spec, deps, stops, member=member,
                                                                           address=address)))
            share = [GoodputShare(goodput, member, deps.events.now, host=host, bound=spec.rendezvous.conf.close_timeout)
                     ] if goodput is not None else []
            features += [news, env, *progress, relay, JobView(spec, deps, session), *_api(spec, deps, logs, member),
                         *share, MemberReport(spec, deps, member)]
            yield Rounds(features, news, gate)
    finally:
        await relay.close()


class WorkerEnv(Feature):
    """What this node adds to every worker's environment in each round it runs (``env``: set for the session)."""

    def __init__(self, env: tuple[tuple[str, str], ...]) -> None:
        self._env = env

    @contextlib.asynccontextmanager
    async def serving(self, round_: Round) -> AsyncIterator[None]:
        round_.env = self._env
        yield


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


@contextlib.asynccontextmanager
async def _probe_endpoint(spec: LaunchSpec, addr: str) -> AsyncIterator[tuple[str, int] | None]:
    """``--network-check``: this node's probe endpoint (``health.probe``), on the address it advertises, answering
    only this job's agents (its secret), for the session's life; None without the check."""
    if not spec.health.network:
        yield None
        return
    from rankrun.health.probe import ProbeServer  # noqa: PLC0415 - a job with --network-check only

    server = ProbeServer(addr, spec.secret)
    try:
        port = await server.start()
    except StoreError as exc:
        raise LauncherError(f"--network-check: {exc}") from None
    try:
        yield addr, port
    finally:
        await server.close()


class NetworkCheck(Feature):
    """This node's part of its round's network check (``rendezvous.netcheck``), from ``netcheck.MIN_NODES`` nodes:
    the round goes unless the check found a node unhealthy (this one or another: the coordinator re-forms the round
    without it) or the round moved on meanwhile. It goes when nobody was, when no verdict came within
    ``verdict_wait`` (said), or when a stop came (the caller's pending stop then ends the job)."""

    def __init__(self, spec: LaunchSpec, deps: AgentDeps, stops: StopStream, session: Session,
                 probe: tuple[str, int]) -> None:
        self._spec, self._say, self._stops, self._member, self._probe = spec, deps.console.say, stops, session.member, probe

    async def before(self, round_: Round) -> bool:
        word = round_.word
        if word is None or word.group_world_size < netcheck.MIN_NODES:
            return True
        from rankrun.health.probe import ProbeError, measure  # noqa: PLC0415 - a job with --network-check only

        spec, member, run_id = self._spec, self._member, self._spec.rendezvous.run_id

        async def one(addr: str, port: int) -> Link | None:
            try:
                return await measure(addr, port, spec.secret, size=netcheck.SIZE, pings=netcheck.PINGS,
                                     timeout=netcheck.MEASURE_TIMEOUT)
            except ProbeError as exc:
                self._say(f"{rendezvous_name(run_id)}: network check: {exc}")
                return None

        reach = netcheck.reach(spec.health.timeout if spec.health.check is not None else None)
        bound = netcheck.verdict_wait(reach)
        part = netcheck.take_part(member.store, member.keys, word.round, word.group_rank, word.group_world_size,
                                  endpoint=self._probe, measure=one, lease=member.lease.id, endpoint_wait=reach)
        try:
            async with asyncio.timeout(bound):
                index, verdict = await first_of(part, member.round_changed(word.round), self._stops.arrived())
        except TimeoutError:
            self._say(f"{rendezvous_name(run_id)}: round {word.round}'s network check gave no verdict within "
                      f"{bound:g} s; starting the workers")
            return True
        except StoreUnavailable as exc:
            raise LauncherError(f"{rendezvous_name(run_id)}: {exc}") from exc
        if index != 0:
            return index == 2
        return not verdict


class JobView(Feature):
    """While a round runs: its stacks exchange (a stall or a ``--stacks`` request gets the whole job's stacks) and,
    with ``--straggler-window`` on Python workers, its watch of the whole job (``agent.stragglers.job``), which this
    node's coordinator, if it coordinates, judges."""

    def __init__(self, spec: LaunchSpec, deps: AgentDeps, session: Session) -> None:
        self._spec, self._deps, self._member, self._judge = spec, deps, session.member, session.coordinator

    @contextlib.asynccontextmanager
    async def serving(self, round_: Round) -> AsyncIterator[None]:
        deps, member, word = self._deps, self._member, round_.word
        assert word is not None
        exchange = Exchange(member.store, member.keys, member.info.id, word, host=host_name(deps, member),
                            run_id=self._spec.rendezvous.run_id, sample=deps.on_demand.sample,
                            show=lambda lines: show(deps.console, lines), lease=member.lease.id,
                            job_lease=member.job.id if member.job is not None else 0)
        serving = [asyncio.create_task(_serve(exchange))]
        stragglers = self._stragglers(word)
        if stragglers is not None:
            serving.append(asyncio.create_task(stragglers.run()))
        try:
            with deps.on_demand.round(exchange, stragglers):
                yield
        finally:
            for task in serving:
                task.cancel()
            await asyncio.gather(*serving, return_exceptions=True)

    def _stragglers(self, word: Assignment) -> JobStragglers | None:
        spec, deps, member, judge = self._spec, self._deps, self._member, self._judge
        if spec.straggler.window <= 0 or spec.worker.entry.kind is EntryKind.BINARY:
            return None
        from rankrun.agent.stragglers.job import JobStragglers  # noqa: PLC0415
        from rankrun.agent.stragglers.watch import Said  # noqa: PLC0415 - with the watch on

        said = Said(lambda line: show(deps.console, [line]), deps.events)
        return JobStragglers(member.store, member.keys, word.round, member.info.id, word.group_world_size,
                             spec.straggler.window, said, where=host_name(deps, member), host=judge is not None,
                             lease=member.lease.id,
                             blame=judge.straggler if judge is not None and spec.straggler.action == "exclude" else None)


async def _serve(exchange: Exchange) -> None:
    """The round's stacks exchange; a store that fails here is the round's business (its watches say so), not this."""
    with contextlib.suppress(StoreUnavailable):
        await exchange.serve()


class ApiValues(Feature):
    """``rankrun.launch``: this node's values, or failures, for the other nodes once its workers end; theirs, at the
    job's end, for the round it ran last."""

    def __init__(self, api: ApiNode, say: Callable[[str], None]) -> None:
        self._api, self._say = api, say
        self._placed: Assignment | None = None

    @contextlib.asynccontextmanager
    async def serving(self, round_: Round) -> AsyncIterator[None]:
        self._placed = round_.word
        yield

    async def after(self, round_: Round, result: AttemptResult) -> None:
        if result.outcome.regrouped is None and round_.word is not None:
            await self._api.report(round_.word, result.outcome.failed, result.results)

    async def ended(self, end: RoundWord) -> None:
        await self._api.job_ended(end, self._placed, self._say)


def _api(spec: LaunchSpec, deps: AgentDeps, logs: RunLogs, member: Member) -> list[Feature]:
    """A ``rankrun.launch`` job's exchange of values and failures between nodes; none for any other job."""
    results = spec.worker.entry.api_results
    if results is None:
        return []
    from rankrun.api.node import ApiNode  # noqa: PLC0415 - the API's jobs only

    spill_dir = logs.base / "values" if logs.base is not None and not logs.temporary else None
    api = ApiNode(member, results, nproc=spec.worker.nproc, host=deps.host, address=host_name(deps, member),
                  spill_dir=spill_dir, run_id=spec.rendezvous.run_id, close_timeout=spec.rendezvous.conf.close_timeout)
    return [ApiValues(api, deps.console.say)]


class MemberReport(Feature):
    """How this node's workers of a round ended, for the coordinator: a round re-formed under them is said here."""

    def __init__(self, spec: LaunchSpec, deps: AgentDeps, member: Member) -> None:
        self._run_id, self._deps, self._member = spec.rendezvous.run_id, deps, member

    async def after(self, round_: Round, result: AttemptResult) -> None:
        outcome, word = result.outcome, round_.word
        assert word is not None
        if outcome.regrouped is not None:
            self._deps.console.say(f"{rendezvous_name(self._run_id)}: round {word.round} stopped: {outcome.regrouped}")
            return
        failed, node, host = outcome.failed, self._deps.events.node, self._deps.host
        await self._member.report(word.round, not failed, node_summary(result.results, host, outcome.stalled) if failed else "",
                                  _root(result, round_.attempt, node) if failed else None,
                                  stall=outcome.stalled, blame=outcome.stall_blame)


def _root(result: AttemptResult, attempt: int, node: str) -> dict[str, object] | None:
    """This node's root cause, for the coordinator to tell every node (None for a stall: no rank failed; the stall's
    cause and blame travel in the result's own keys, ``Member.report``)."""
    root = root_cause(result.results)
    return failure_value(failure(root, attempt, node)) if root is not None else None


def host_name(deps: AgentDeps, member: Member) -> str:
    """This node as reports name it: two nodes may share a host name, so with its address."""
    return f"{deps.host}/{member.info.addr}" if member.info.addr else deps.host
