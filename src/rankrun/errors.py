"""rankrun's one exception tree.

The errors rankrun raises for the user to read derive from ``RankrunError``. Each carries its documented exit code,
and the launcher prints ``str(exc)`` as one line, never a traceback: ``rankrun.cli`` for those raised while the
command line is read, ``rankrun.main`` for those raised once the job runs. The Python API (``rankrun.api.launch``)
also raises Python's own ``ValueError`` (a bad option) and ``RuntimeError`` (a launch from inside a worker) in the
caller, as Python APIs do::

    RankrunError                      exit_code
    ├── WorkerError                   1   rankrun.launch(fn): workers failed (``failures``: each failed rank's record)
    ├── UsageError                    2   bad flag or value; the message names both
    │   ├── ArgumentError             2   argparse's own message (unknown option, bad type)
    │   │   └── _NoScript             2   no training script (``rankrun.cli``: the line is read again for a typo)
    │   └── NotSupportedYetError      2   a valid request this version cannot serve
    ├── NodeExcluded                  4   this node is unhealthy (its check, or blamed too often): drain or reschedule it
    └── LauncherError                 3   the launcher's own machinery failed
        ├── StoreError                3   a listening socket could not be bound (``rankrun.listen``), or a store relay
        │                                 could not serve its node's workers (``workerstore.relay``)
        ├── SpawnError                3   a worker process could not be started
        └── StoreUnavailable          3   the rendezvous store cannot be reached, or the connection was lost
            ├── AuthenticationFailed  3   the two sides do not share this job's secret (or etcd refused the user)
            ├── LeaseLost             3   a lease expired or was revoked: its keys are gone
            ├── Compacted             3   a watch asked for history the store no longer keeps
            ├── NotCoordinator        3   an elected coordinator found the election moved on without it
            ├── RendezvousClosed      3   the job this node wants to join has already finished
            ├── RendezvousHeld        3   the endpoint serves another job's rendezvous (another --rdzv-id)
            └── EtcdError             3   etcd answered with an error (``store.etcd.gateway``: it carries the endpoint)

Every class below ``RankrunError`` anywhere in rankrun is drawn here (``tests/unit/test_claims.py``).

A worker that exits non-zero is *not* an exception to the launcher: it is an outcome (see
``rankrun.report``), reported with exit code 1. Only the Python API (``rankrun.launch``) raises it, as
``WorkerError``, to its caller.
"""

from __future__ import annotations

EXIT_SUCCESS = 0
EXIT_WORKERS_FAILED = 1
EXIT_USAGE = 2
EXIT_LAUNCHER = 3
EXIT_UNHEALTHY = 4  # this node was excluded from its job: a scheduler should drain it, not start it there again
EXIT_SIGNAL_BASE = 128


def exit_code(outcome: int, first_signal: int | None) -> int:
    """The launcher's exit code (pure): ``outcome`` (0, 1, 3, ...) unless a handled signal arrived.

    The rule, here and only here: once rankrun has received a handled signal, before the job's
    outcome is final (up to the end of the final flush), it exits 128+N for the first such signal,
    whatever the workers did. Interrupted is never success: not when the workers exit 0 just as
    the signal lands, not when the signal is taken off the stop stream by a consumer that cannot
    act on it (the drain after the group had ended) or arrives while the loop winds down.
    ``first_signal`` is the catcher's record, written on arrival, so no interleaving of consumers
    can lose it.
    """
    return EXIT_SIGNAL_BASE + first_signal if first_signal is not None else outcome


def ending(code: int) -> str:
    """How a job that exits ``code`` ended, in its ``job.end`` event's words (pure): succeeded, failed (its workers),
    interrupted (a signal), error (the launcher's own, or a usage error)."""
    if code == EXIT_SUCCESS:
        return "succeeded"
    if code == EXIT_WORKERS_FAILED:
        return "failed"
    return "interrupted" if code > EXIT_SIGNAL_BASE else "error"


def excluded(code: int | None) -> bool:
    """Whether a launcher that exited ``code`` was excluded from its job (pure): its own end, not the job's outcome."""
    return code == EXIT_UNHEALTHY


class RankrunError(Exception):
    """Base of every error rankrun raises deliberately."""

    exit_code: int = EXIT_LAUNCHER


class UsageError(RankrunError):
    """The user asked for something malformed; the message names the flag and the value."""

    exit_code = EXIT_USAGE

    def __init__(self, flag: str, value: object, reason: str) -> None:
        self.flag = flag
        self.value = value
        self.reason = reason
        shown = repr(value) if isinstance(value, str) else str(value)
        super().__init__(f"{flag} {shown}: {reason}" if flag else f"{shown}: {reason}")


class ArgumentError(UsageError):
    """argparse's own complaint (unknown option, bad type or choice), already naming flag and value."""

    def __init__(self, message: str) -> None:
        RankrunError.__init__(self, message)
        self.flag, self.value, self.reason = "", message, message


class NotSupportedYetError(UsageError):
    """A well-formed request that this version of rankrun does not implement."""


class NodeExcluded(RankrunError):
    """This node was excluded from the job (its health check failed, or it was blamed for ``--max-node-failures``
    failures), or it came back to a job that had excluded it: it runs no worker in this job again."""

    exit_code = EXIT_UNHEALTHY


class LauncherError(RankrunError):
    """The launcher itself failed (not the user's workers, not the user's input)."""

    exit_code = EXIT_LAUNCHER


class StoreError(LauncherError):
    """A listening socket could not be bound (``rankrun.listen``: the workers' TCPStore, the rendezvous endpoint, the
    probe and metrics endpoints, a store relay's port), or a node's store relay could not serve its workers
    (``workerstore.relay``: the host's store could not be reached or refused the relay, or the relay ran out of
    connection ids)."""


class SpawnError(LauncherError):
    """A worker process could not be started (missing binary, exec failure)."""


class StoreUnavailable(LauncherError):
    """The rendezvous store cannot be reached, or the connection to it was lost."""


class AuthenticationFailed(StoreUnavailable):
    """The two sides do not share this job's secret (or only one of them has one)."""


class LeaseLost(StoreUnavailable):
    """The lease expired or was revoked: its keys are gone."""


class Compacted(StoreUnavailable):
    """A watch asked for history the store no longer keeps."""


class NotCoordinator(StoreUnavailable):
    """An elected coordinator found, on a write, that the election has moved on without it."""


class RendezvousClosed(StoreUnavailable):
    """The job this node wants to join has already finished."""


class RendezvousHeld(StoreUnavailable):
    """The embedded store at this job's endpoint is another job's (another ``--rdzv-id``): refused at the handshake,
    at once, not a wait for ``join_timeout``."""


class WorkerError(RankrunError):
    """``rankrun.launch(fn, ...)``: the job's workers failed. ``failures`` maps each failed global rank to its
    ``rankrun.api.results.Failure``; ``__cause__`` is the root cause's exception when it could be rebuilt;
    ``str()`` is the failure report the CLI prints."""

    exit_code = EXIT_WORKERS_FAILED

    def __init__(self, report: str, failures: dict[int, object]) -> None:
        super().__init__(report)
        self.failures = failures
