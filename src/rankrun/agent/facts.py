"""The lifecycle facts the agent emits, built from what it already holds (pure): the job's options, how a group
ended, the root cause of a failed attempt, how the job ended. Each is one record of ``rankrun.events.records``; the
agent hands it to the job's ``EventStream`` at the place that decides it.
"""

from __future__ import annotations

from collections.abc import Mapping

from rankrun import told
from rankrun.errors import ending
from rankrun.events.records import Failure, JobOutcome, JobStart, WorkersOutcome
from rankrun.proc.group import GroupOutcome
from rankrun.report.failure import WorkerResult, failure_words, signal_name
from rankrun.spec import DynamicRendezvous, LaunchSpec, StaticRendezvous


def job_start(spec: LaunchSpec) -> JobStart:
    """The options that shape the job."""
    rdzv = spec.rendezvous
    nnodes = str(rdzv.min_nodes) if rdzv.min_nodes == rdzv.max_nodes else f"{rdzv.min_nodes}:{rdzv.max_nodes}"
    backend = rdzv.backend if isinstance(rdzv, DynamicRendezvous) else \
        "static" if isinstance(rdzv, StaticRendezvous) else "standalone"
    return JobStart(spec.worker.nproc, nnodes, spec.restart.max_restarts, backend, spec.worker.entry.title)


def workers_outcome(outcome: GroupOutcome) -> WorkersOutcome:
    """How this node's group ended, in the schema's words (a signal first: it stopped whatever else happened)."""
    if outcome.interrupted_by is not None:
        return "interrupted"
    if outcome.regrouped is not None:
        return "moved_on"
    if outcome.stalled is not None:
        return "stalled"
    return "failed" if outcome.failed else "succeeded"


def failure(result: WorkerResult, attempt: int, host: str) -> Failure:
    """The root cause of a failed attempt, as the ``failure`` event states it: its exception is ``failure_words``'
    (the error file's first line, else the exception line of the traceback that ended its output; None when neither
    says)."""
    status = result.status
    return Failure(attempt, result.rank, host, status if status >= 0 else None,
                   signal_name(-status) if status < 0 else None, failure_words(result).exception)


def failure_value(fact: Failure) -> dict[str, object]:
    """A failure as the rendezvous carries it to the other nodes (the keys of its event)."""
    return {"rank": fact.rank, "host": fact.host, "exit_code": fact.exit_code, "signal": fact.signal,
            "exception": fact.exception}


def failure_from(value: Mapping[str, object], attempt: int) -> Failure | None:
    """The failure another node published (``failure_value``), for this node's ``attempt``; None if malformed."""
    rank, host = value.get("rank"), value.get("host")
    code, sig, exc = value.get("exit_code"), value.get("signal"), value.get("exception")
    if not isinstance(rank, int) or not isinstance(host, str):
        return None
    return Failure(attempt, rank, host, code if isinstance(code, int) else None, sig if isinstance(sig, str) else None,
                   exc if isinstance(exc, str) else None)


def failure_line(fact: Failure) -> str:
    """A failure in one line, as a node that did not run the rank says it: ``rank 5 on HOST exited 1: Type: message``
    (``killed by SIGKILL`` for a signal; the host left out when the record has none)."""
    return told.failure_line(fact.rank, fact.host, fact.exit_code, fact.signal, fact.exception)


def job_outcome(code: int, error: bool = False) -> JobOutcome:
    """How the job ended, from its exit code (``error``: the launcher's own error ended it)."""
    word = "error" if error else ending(code)
    return word if word in ("succeeded", "failed", "interrupted") else "error"  # type: ignore[return-value]
