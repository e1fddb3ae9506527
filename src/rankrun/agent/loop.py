"""One node's restart loop: store → plan → attempt → decide → restart / finish / give up / shut down → report.

``run_agent`` is one screen of sequencing over injected dependencies (``AgentDeps``: spawner,
console, stores, clock) so scenarios can run on fakes; every decision (``plan``, ``decide``,
``group_ended``) is a pure function, and the exit code is chosen by ``rankrun.errors.exit_code``
(a handled signal always wins). The facts it decides go to the job's event stream (``deps.events``): the job's
start and end (``agent.observers``, whose consumers ``--events`` and ``--metrics-port`` ask for), a failed attempt's
root cause and the restart. Each attempt is a round without a store: its open-files line, ``--health-check`` and
events go through the round's seam (``agent.round``: ``_features`` lists them), as several nodes' rounds do. The
process-wide set-up around it is ``rankrun.main``.
"""

from __future__ import annotations

import asyncio

from rankrun.agent.attempt import AttemptResult, Outcome, run_attempt, worker_argv
from rankrun.agent.checkpoint import Keeping, KeptProgress, keeping
from rankrun.agent.deps import AgentDeps
from rankrun.agent.facts import failure
from rankrun.agent.gate import HealthGate, excluded, unhealthy
from rankrun.agent.lines import ConsoleLines, interrupted_line, received
from rankrun.agent.observers import JobObservers
from rankrun.agent.plan import AttemptPlan, Membership, single_node
from rankrun.agent.preload import preloading
from rankrun.agent.round import NewsEvents, OpenFiles, Round, Rounds, formed
from rankrun.agent.watch import DONE, STARTING
from rankrun.errors import LauncherError, NodeExcluded, RankrunError, exit_code
from rankrun.events.records import Record, Restart
from rankrun.listen import hold
from rankrun.logs.console import Console
from rankrun.logs.layout import RunLogs
from rankrun.logs.routes import filter_note
from rankrun.policy import Action, Failed, GroupEnded, Signalled, Succeeded, decide
from rankrun.proc.early import EarlyCatcher
from rankrun.proc.group import GroupOutcome
from rankrun.proc.signals import Interrupted, StopStream, attach, detach
from rankrun.report.errorfile import write_error_file
from rankrun.report.failure import (
    WorkerResult,
    render_report,
    restart_reason,
    root_cause,
    root_cause_json,
    signal_name,
)
from rankrun.slurm import job_words
from rankrun.spec import DynamicRendezvous, LaunchSpec, api_dir
from rankrun.stacks.flight import has_dumps

LOCAL_ADDRESS = "127.0.0.1"  # one node's address for its events and metrics, without --local-addr


async def run_agent(spec: LaunchSpec, deps: AgentDeps, catcher: EarlyCatcher) -> int:
    loop = asyncio.get_running_loop()
    deps.events.run = spec.rendezvous.run_id
    deps.events.add(ConsoleLines(deps.console.say, spec.restart.max_restarts))
    watchdog = deps.watchdog
    observers = JobObservers(spec, deps.events, deps.console,
                             (watchdog.own_file, watchdog.disown_file) if watchdog is not None else None)
    observers.open()  # a bad --events path: the user's error, before anything starts
    if (note := filter_note(spec.logs, spec.worker.nproc)) is not None:
        deps.console.say(note)
    stops = attach(catcher, loop, spec.signals)
    try:
        final, kept = await _run(spec, deps, stops, observers)
    except Exception as exc:  # the launcher's error (or a bug) ended the job: job.end says so, last
        await observers.end(exc.exit_code if isinstance(exc, RankrunError) else LauncherError.exit_code, error=True,
                            node=spec.local_addr or (deps.host if spec.multi_node else LOCAL_ADDRESS))
        raise
    finally:
        detach(catcher, loop)  # still caught (and counted) while the loop closes and the console flushes
    first = catcher.first
    code = exit_code(final.exit_code, first)
    if first is not None and code != final.exit_code:  # e.g. the workers had all exited 0 as it came: it still wins
        deps.console.say(f"received {signal_name(first)} as the job ended; exiting")
    await observers.end(code)
    # Last of all, after every other line: the report (the private log dir is gone by now).
    if final.report is not None or final.job_cause:
        _report(spec, deps, final, error_files_kept=kept)
    return code


async def _run(spec: LaunchSpec, deps: AgentDeps, stops: StopStream, observers: JobObservers) -> tuple[Outcome, bool]:
    """The job on this node; returns how it ended and whether worker logs were kept."""
    deps.on_demand.idle(spec.rendezvous.run_id, STARTING)  # for rankrun --stacks, until workers run
    logs = RunLogs(spec.logs, spec.rendezvous.run_id)
    if deps.watchdog is not None and logs.base is not None and not logs.keep:
        deps.watchdog.own_dir(str(logs.base))  # removed by the watchdog if we are killed -9
    if deps.watchdog is not None and (caller_dir := api_dir(spec.base_env)) is not None:
        deps.watchdog.own_dir(caller_dir)  # rankrun.launch's: we die with its caller, which then cleans up nothing
    try:
        final = await _preloaded(spec, deps, stops, logs, observers)
    finally:
        deps.on_demand.idle(spec.rendezvous.run_id, DONE)
        kept = logs.finish(keep=logs.base is not None and has_dumps(logs.base))
        if kept is not None and spec.logs.log_dir is None:
            deps.console.say(f"worker logs kept in {kept}")
    return final, kept is not None


async def _preloaded(spec: LaunchSpec, deps: AgentDeps, stops: StopStream, logs: RunLogs,
                     observers: JobObservers) -> Outcome:
    """The job's rounds, with ``--preload``'s process (``agent.preload``) around them, started first."""
    held: asyncio.Server | None = None
    if not spec.multi_node:  # job.start at the job's start, the import included (several nodes: once the session is open)
        await observers.begin(spec.local_addr or LOCAL_ADDRESS)
    async with preloading(spec, deps, worker_argv(spec.worker.entry, 0), stops), keeping(spec, deps, stops) as kept:
        try:
            if isinstance(spec.rendezvous, DynamicRendezvous) and not spec.multi_node:
                # single-node c10d: hold the rendezvous endpoint so a second job on it fails loudly
                held = await hold(spec.rendezvous.endpoint_host, spec.rendezvous.endpoint_port)
            if spec.multi_node:
                from rankrun.agent.multinode import run_multinode  # noqa: PLC0415 - one node never pays for its imports

                return await run_multinode(spec, deps, stops, logs, begin=observers.begin, kept=kept,
                                           goodput=observers.goodput)
            port = await deps.worker_store.start(spec.store.host, spec.store.port)
            return await _attempts(spec, deps, stops, logs, single_node(spec, port), kept=kept)
        finally:
            await deps.worker_store.close()
            if held is not None:
                held.close()


def group_ended(outcome: GroupOutcome) -> GroupEnded:
    """How a group ended, for ``decide`` (pure). One node's group never ends for a new membership (``regrouped``): that
    is ``agent.multinode``'s, whose coordinator decides the next round."""
    if outcome.interrupted_by is not None:
        return Signalled(outcome.interrupted_by)
    return Failed() if outcome.failed else Succeeded()


def _features(spec: LaunchSpec, deps: AgentDeps, stops: StopStream, kept: Keeping | None) -> Rounds:
    """One node's round-level features, listed once (``agent.round``): its rounds have no store; the open-files line
    comes first, before the first check."""
    news = NewsEvents(deps.events)
    gate = HealthGate(lambda: unhealthy(spec, deps, stops), first=True)
    progress = [KeptProgress(kept, deps, spec.worker.nproc)] if kept is not None else []
    return Rounds([OpenFiles(deps.console.say, spec, nodes=0), gate, news, *progress], news, gate)


async def _attempts(spec: LaunchSpec, deps: AgentDeps, stops: StopStream, logs: RunLogs, membership: Membership, *,
                    kept: Keeping | None) -> Outcome:
    rounds = _features(spec, deps, stops, kept)
    restarts, attempt = 0, -1
    while True:
        attempt += 1
        watch = rounds.round(Round(attempt, restarts, master=(membership.master_addr, membership.master_port)))
        go = await watch.before()  # --health-check before every attempt, the first included
        early = stops.take_pending()  # a stop during the check ended it: the stop wins
        if isinstance(early, Interrupted):
            when = "before the workers started" if attempt == 0 else f"before restart {restarts}"
            deps.console.say(received(early.signum, when))
            return Outcome.signalled(early.signum, restarts)
        if not go:
            raise NodeExcluded(excluded(deps.host, spec.rendezvous.run_id, rounds.sick or ""))
        formed_at = asyncio.get_running_loop().time()
        await deps.worker_store.reset()  # fresh keyspace per attempt: restarts after init_process_group work
        # one node's rendezvous is the fresh keyspace: a round per attempt, as torchrun has one per restart
        took = round(asyncio.get_running_loop().time() - formed_at, 6)
        watch.told((formed(attempt + 1, membership, took),))
        async with watch.serving() as served:
            plan = AttemptPlan(attempt, restarts, membership, served.env, rendezvous=took)
            result = await run_attempt(spec, plan, logs.attempt_dir(attempt, spec.worker.nproc), deps, stops)
        await watch.after(result)
        event = group_ended(result.outcome)
        action = decide(event, restarts, spec.restart.max_restarts)
        root = root_cause(result.results)
        told: tuple[Record, ...] = (failure(root, attempt, deps.events.node),) if root is not None else ()  # this node is the job
        if action is Action.RESTART:
            told += (Restart(attempt + 1, _restart_reason(result), spec.restart.max_restarts - restarts - 1),)
        watch.told(told)
        if action is Action.RESTART:
            restarts += 1
            continue
        if isinstance(event, Signalled):
            _say_interrupted(deps.console, result)
            return Outcome.signalled(event.signum, restarts)
        if action is Action.GIVE_UP:
            return Outcome.failed(restarts, result)
        return Outcome.succeeded(restarts)


def _restart_reason(attempt: AttemptResult) -> str:
    """What failed, the ``restart`` event's reason (its console line is ``agent.lines``')."""
    return restart_reason(attempt.results, attempt.outcome.stalled)


def _say_interrupted(console: Console, attempt: AttemptResult) -> None:
    outcome = attempt.outcome
    console.say(interrupted_line(outcome.interrupted_by or 0, outcome.second_signal, attempt.results))


def _report(spec: LaunchSpec, deps: AgentDeps, final: Outcome, *, error_files_kept: bool) -> None:
    results = final.report.results if final.report is not None else []
    stalled = final.report.outcome.stalled if final.report is not None else None
    slurm = job_words(spec.base_env)
    text = render_report(spec.worker.entry.title, deps.host, final.restarts, results, error_files_kept=error_files_kept,
                         job_cause=final.job_cause, stalled=stalled, slurm=slurm, excluded=final.excluded)
    if not _report_json(spec, deps, text, results):  # rankrun.launch's caller raises it (WorkerError's text) instead
        deps.console.set_epilogue(text.encode())  # written by close(), after every other byte
    root = root_cause(results)
    own_error_file = spec.base_env.get("TORCHELASTIC_ERROR_FILE")
    if root is not None and own_error_file:
        try:
            write_error_file(own_error_file, root_cause_json(root, slurm))
        except OSError as exc:
            deps.console.say(f"cannot write TORCHELASTIC_ERROR_FILE {own_error_file}: {exc}")


def _report_json(spec: LaunchSpec, deps: AgentDeps, text: str, results: list[WorkerResult]) -> bool:
    """For the Python API (``RANKRUN_REPORT_JSON`` in the launcher's environment): the report and how each rank ended.
    Whether it was written (then the caller has the report, and stderr does not get it)."""
    path = spec.base_env.get("RANKRUN_REPORT_JSON")
    if not path:
        return False
    import json  # noqa: PLC0415 - the API's launches only

    workers = [{"rank": r.rank, "status": r.status, "ending": r.ending.value} for r in results]
    root = root_cause(results)
    try:
        write_error_file(path, json.dumps({"report": text, "host": deps.host, "workers": workers,
                                           "root": root.rank if root is not None else None}))
    except OSError as exc:
        deps.console.say(f"cannot write RANKRUN_REPORT_JSON {path}: {exc}")
        return False
    return True


__all__ = ["AgentDeps", "group_ended", "run_agent"]
