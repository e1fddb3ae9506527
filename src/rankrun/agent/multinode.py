"""Several nodes: round after round until the job ends, in a session (``rendezvous.session``) that hosts or joins.

The session owns the backend (hosting the embedded store, joining it, or etcd) and this node's
``Member``; this module only sequences the rounds, through the round's seam (``agent.round``: one ``RoundWatch`` a
round; the features, listed once, are ``agent.features.multi_node``'s). The loop::

    join → wait for the coordinator's word (bounded by join_timeout, a progress line every 5 s)
         → before: go or skip (--health-check on rounds after the first, --network-check's verdict, the open-files
           line); a node found unhealthy: wait for the next word
         → told: what ended the round before, the exclusions, the new round (events)
         → serving: the attempt, stopped early when the round key moves on (a node joined or left, another
           node's workers failed) or this node's lease is lost
         → after: report how my workers ended → wait for the next word: a new round, or the end

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
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from rankrun.agent.attempt import AttemptResult, Outcome, run_attempt
from rankrun.agent.checkpoint import Keeping
from rankrun.agent.deps import AgentDeps
from rankrun.agent.features import multi_node
from rankrun.agent.gate import excluded as excluded_line
from rankrun.agent.gate import unhealthy
from rankrun.agent.goodput import JobGoodput
from rankrun.agent.lines import interrupted_line, received
from rankrun.agent.plan import AttemptPlan, Membership
from rankrun.agent.race import first_error, first_of
from rankrun.agent.round import Round, Rounds, ended_news, exclusions, formed, news
from rankrun.errors import LauncherError, NodeExcluded, StoreUnavailable
from rankrun.logs.layout import RunLogs
from rankrun.proc.signals import Interrupted, StopStream
from rankrun.rendezvous.keys import Assignment, Excluded, RoundWord, Spare
from rankrun.rendezvous.member import Ended, Member, wall_time
from rankrun.rendezvous.session import Session, open_session
from rankrun.spec import DynamicRendezvous, LaunchSpec, StaticRendezvous, on_etcd, rendezvous_name

PROGRESS_EVERY = 5.0  # seconds between "3/4 nodes joined" lines while waiting


async def run_multinode(spec: LaunchSpec, deps: AgentDeps, stops: StopStream, logs: RunLogs, *,
                        begin: Callable[[str], Awaitable[None]] | None = None, kept: Keeping | None = None,
                        goodput: JobGoodput | None = None) -> Outcome:
    """The job on this node, round after round; ``begin``: told this node's address once the session is open (the
    job's observers start there); ``kept``: the node's keeper of kept progress; ``goodput``: the job's account."""
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
            async with multi_node(spec, deps, stops, logs, session, sick=sick, kept=kept, goodput=goodput) as rounds:
                return await _rounds(_Node(spec, deps, stops, logs, session), rounds, joined, opened)
    except BaseExceptionGroup as failed:  # a background task failed: that error, not a group, is what the user sees
        raise first_error(failed) from None


@dataclass(frozen=True)
class _Node:
    """What the rounds of this node act through."""

    spec: LaunchSpec
    deps: AgentDeps
    stops: StopStream
    logs: RunLogs
    session: Session


# --------------------------------------------------------------------------- the rounds


async def _rounds(node: _Node, rounds: Rounds, joined: float, opened: float) -> Outcome:
    """Round after round until the job ends for this node. ``joined``: when this node set out for its first round;
    ``opened``: when it set out to reach the host (join_timeout's start)."""
    spec, deps, member, loop = node.spec, node.deps, node.session.member, asyncio.get_running_loop()
    previous, attempt, restarts, spare_said = 0, -1, 0, False
    last: AttemptResult | None = None
    placed: Assignment | None = None  # this node's place in the last round it ran
    while True:
        word = await _wait_for_word(node, previous, sick=rounds.sick, since=opened if previous == 0 else None)
        if not isinstance(word, Assignment | Spare):
            return await _unplaced(node, rounds, word, (placed, last), attempt, restarts)
        previous = word.round
        if isinstance(word, Spare):
            spare_said = spare_said or _say_spare(spec, deps)
            continue
        watch = rounds.round(Round(attempt + 1, restarts, word, (word.master_addr, word.master_port)))
        if not await watch.before():  # unhealthy, or the network check found a node that is: the next word says
            continue  # what comes next, this node's exclusion or the round without it
        if (pending := node.stops.take_pending()) is not None:  # a signal that came as the word did: the job stops
            return _stopped(deps, received(pending.signum, f"as round {word.round} formed"), pending.signum, restarts)
        left = spec.restart.max_restarts - word.restarts if word.restarts > restarts else None
        took = round(loop.time() - joined, 6)
        watch.told(ended_news(news(placed, word, restarts, member.word), attempt, left) + exclusions(member.word)
                   + (formed(word.round, word, took),))
        attempt, restarts, placed = attempt + 1, word.restarts, word
        async with watch.serving() as served:
            assert served.master is not None
            plan = AttemptPlan(attempt, word.restarts, _membership(spec, word, served.master), served.env,
                               rendezvous=took)
            last = await run_attempt(spec, plan, node.logs.attempt_dir(attempt, spec.worker.nproc), deps, node.stops,
                                     _the_round_moved_on(member, word.round))
        if (signum := last.outcome.interrupted_by) is not None:  # said on every node that received it, as one node says it
            return _stopped(deps, interrupted_line(signum, last.outcome.second_signal, last.results), signum, restarts)
        if member.lease.lost.is_set():
            raise LauncherError(f"{rendezvous_name(spec.rendezvous.run_id)}: this node lost its place in the job: "
                                f"{node.session.why_lost()}; workers stopped")
        await watch.after(last)
        joined = loop.time()  # the next round's time counts from here


async def _unplaced(  # noqa: PLR0917 - private; what _rounds holds
    node: _Node, rounds: Rounds, word: Interrupted | Excluded | Ended, ran: tuple[Assignment | None, AttemptResult | None],
    attempt: int, restarts: int,
) -> Outcome:
    """The word that ends the job for this node: a signal, its exclusion, or the job's end (``ran``: this node's place
    in the last round it ran, and how its workers ended there)."""
    if isinstance(word, Interrupted):
        node.deps.console.say(received(word.signum, "while waiting for the rendezvous"))
        return Outcome.signalled(word.signum, restarts)
    out = _left_out(word, node.session, rounds.sick)
    if out is not None:
        return await _excluded(node, rounds, out, restarts)
    assert isinstance(word, Ended)  # an Excluded is always this node's exclusion
    placed, last = ran
    ran_it = placed is not None and word.word.round == placed.round  # what ended this node's round, if not told
    rounds.told(ended_news(word.word if ran_it else None, attempt) + exclusions(word.word))
    await rounds.ended(word.word)
    # a spare was never given a place; a node whose place came as another node's failure ended the job (it never got
    # to start its workers) failed with the job
    return _ended(node.spec, node.deps, word.word, last, excluded=rounds.heard,
                  spare=attempt < 0 and not word.placed and word.word.round > 0)  # 0: none formed


def _stopped(deps: AgentDeps, line: str, signum: int, restarts: int) -> Outcome:
    """A signal this node received ends its part of the job: it says so (``line``), as every node that got it does."""
    deps.console.say(line)
    return Outcome.signalled(signum, restarts)


def _say_spare(spec: LaunchSpec, deps: AgentDeps) -> bool:
    deps.console.say(f"{rendezvous_name(spec.rendezvous.run_id)}: the job is full ({spec.rendezvous.max_nodes} nodes); "
                     "this node waits as a spare")
    return True


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


async def _excluded(node: _Node, rounds: Rounds, word: Excluded, restarts: int) -> Outcome:
    """This node is out of the job for good: it leaves with exit code 4, or, when the job's store (the embedded host) or
    its coordination (etcd) is here, serves the job without workers until it ends, and leaves with its exit code;
    meanwhile each later exclusion is a ``node.excluded`` here too."""
    deps, session = node.deps, node.session
    member, run_id = session.member, node.spec.rendezvous.run_id
    me = f"this node ({deps.host}, {member.info.addr})"
    if session.coordinator is None:
        raise NodeExcluded(f"{me} is excluded from job {run_id}: {word.reason}; drain it or reschedule elsewhere")
    deps.console.say(f"{me} is excluded from job {run_id} since {wall_time(word.at)}: {word.reason}; it keeps serving "
                     "the rendezvous and the workers' store, without workers, until the job ends")
    deps.on_demand.waiting(run_id)
    while True:
        index, value = await first_of(member.wait_for_end(lambda w: rounds.told(exclusions(w))), node.stops.arrived(),
                                      member.lease.lost.wait())
        if index == 1:
            stop = node.stops.take_pending()
            if stop is None:
                continue  # another consumer took it first
            deps.console.say(received(stop.signum, "while serving the job without workers"))
            return Outcome.signalled(stop.signum, restarts)
        if index == 2:
            raise LauncherError(f"{rendezvous_name(run_id)}: lost its place while serving the job: {session.why_lost()}")
        end: RoundWord = value
        rounds.told(exclusions(end))
        break
    deps.console.say(f"{rendezvous_name(run_id)}: the job ended ({'succeeded' if end.ok else 'failed'}); this node served it "
                     f"without workers: excluded: {word.reason}")
    if end.ok:
        return Outcome.succeeded(end.restarts)
    if end.stranded:
        raise LauncherError(f"{rendezvous_name(run_id)}: the job ended: {end.reason}")
    return Outcome.failed(end.restarts, None, end.cause or end.reason, excluded=dict(end.excluded))


def _ended(spec: LaunchSpec, deps: AgentDeps, end: RoundWord, last: AttemptResult | None, *, spare: bool,
           excluded: dict[str, str]) -> Outcome:
    if spare:
        deps.console.say(f"{rendezvous_name(spec.rendezvous.run_id)}: the job ended "
                         f"({'succeeded' if end.ok else 'failed'}) while this node waited as a spare")
        return Outcome.succeeded(end.restarts)
    if end.ok:
        return Outcome.succeeded(end.restarts)
    if end.stranded:  # not the workers' failure: the job could not go on with the nodes left
        raise LauncherError(f"{rendezvous_name(spec.rendezvous.run_id)}: the job ended: {end.reason}")
    return Outcome.failed(end.restarts, last, end.cause or end.reason, excluded=excluded)


async def _wait_for_word(
    node: _Node, previous: int, *, sick: str | None = None, since: float | None = None,
) -> Assignment | Spare | Ended | Interrupted:
    """The next word from the coordinator, or a signal; bounded by join_timeout, with a progress line every 5 s.
    ``sick``: this node's failed check; a node that no coordinator excluded by join_timeout (none was elected: it
    does not stand itself) leaves as unhealthy all the same, exit 4, not as a rendezvous that timed out.
    ``since``: the first round's wait counts from when this node set out to join (reaching the host is part of it),
    except on the node that coordinates, whose coordinator ends the job for every node at join_timeout after it
    began (``round._first_wait``): its own bound, from now, comes after that."""
    spec, deps, stops, session = node.spec, node.deps, node.stops, node.session
    rdzv = spec.rendezvous
    member = session.member
    bound = rdzv.conf.join_timeout
    if since is not None and session.coordinator is None:
        bound = max(0.0, bound - (asyncio.get_running_loop().time() - since))
    deps.on_demand.waiting(rdzv.run_id)  # what rankrun --stacks says meanwhile
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


async def _the_round_moved_on(member: Member, round_: int) -> str:
    """Ends, with why, once the round is over (re-forming, the job ended) or this node lost its lease."""
    try:
        index, value = await first_of(member.round_changed(round_), member.lease.lost.wait())
    except StoreUnavailable as exc:
        return str(exc)
    return (value.reason or value.phase.value) if index == 0 else "this node's lease was lost"
