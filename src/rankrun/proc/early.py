"""Record the handled signals from the launcher's first instant; leave every other one alone.

Imports nothing but ``signal``, ``os`` and ``sys`` (all loaded with the interpreter) so the
entry points can install it before anything else is imported. Which signals it catches is
read cheaply from argv/``PET_SIGNALS_TO_HANDLE`` (torchrun's default set if absent); once the
CLI has parsed the real value, ``adopt`` makes the set exact: a signal outside it gets back
the disposition rankrun inherited (``nohup``'s ignored SIGHUP stays ignored) and, if it
arrived meanwhile, is re-delivered under that disposition, so the early window behaves as
if the exact set had been installed from the start. Until the event loop takes over
(``rankrun.proc.signals.attach``), a caught signal is only recorded; the agent then replays
it and exits without starting workers.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import FrameType

DEFAULT_SIGNALS: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
_SPELLINGS = ("--signals-to-handle", "--signals_to_handle")
_UNHANDLEABLE = (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD)

_Disposition = Callable[[int, FrameType | None], object] | int | signal.Handlers | None


def requested_signals(argv: Sequence[str], env: Mapping[str, str]) -> tuple[int, ...]:
    """A cheap first reading of ``--signals-to-handle`` (the CLI parses it properly later)."""
    text = env.get("PET_SIGNALS_TO_HANDLE", "").strip() or None  # empty: unset, as every PET_ variable
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if len(name) >= 4 and any(s.startswith(name) for s in _SPELLINGS):
            text = value if eq else (argv[i + 1] if i + 1 < len(argv) else text)
            break
    if text is None:
        return DEFAULT_SIGNALS
    found: list[int] = []
    for name in (n.strip() for n in text.split(",")):
        sig = getattr(signal.Signals, name, None) if name.startswith("SIG") else None
        if sig is not None and sig not in _UNHANDLEABLE:
            found.append(int(sig))
    return tuple(dict.fromkeys(found))


class EarlyCatcher:
    def __init__(self, signums: tuple[int, ...]) -> None:
        self.signums = signums
        self.pending: list[int] = []  # caught, not yet handed to the event loop's stream
        self.received: list[int] = []  # every handled signal that arrived, in order; never consumed
        self.on_signal: Callable[[int], None] | None = None  # called once one is recorded (not on the loop)
        self._inherited: dict[int, _Disposition] = {}

    @property
    def first(self) -> int | None:
        """The first handled signal this process received, if any."""
        return self.received[0] if self.received else None

    def note(self, signum: int) -> None:
        """Record a handled signal that arrived (the event loop's handler calls this too)."""
        self.received.append(signum)

    @classmethod
    def install(cls, signums: Iterable[int] | None = None) -> EarlyCatcher:
        wanted = tuple(signums) if signums is not None else requested_signals(sys.argv[1:], os.environ)
        catcher = cls(())
        catcher.adopt(wanted)
        return catcher

    def adopt(self, signums: Iterable[int]) -> None:
        """Catch exactly ``signums`` from now on; give every other signal its inherited disposition back."""
        wanted = tuple(dict.fromkeys(signums))
        for signum in wanted:
            if signum not in self._inherited:
                self._inherited[signum] = signal.signal(signum, self._record)
        for signum in [s for s in self._inherited if s not in wanted]:
            inherited = self._inherited.pop(signum)
            # Python's own SIGINT handler is not what rankrun inherited from its parent: SIG_DFL was.
            restored = signal.SIG_DFL if inherited in (signal.default_int_handler, None) else inherited
            signal.signal(signum, restored)
            self.received = [s for s in self.received if s != signum]  # as if never caught
            if signum in self.pending:
                self.pending = [s for s in self.pending if s != signum]
                if restored == signal.SIG_DFL:
                    os.kill(os.getpid(), signum)  # what would have happened had we never caught it
        if signal.SIGINT not in wanted and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            # Python's KeyboardInterrupt handler is the interpreter's, not what rankrun inherited (SIG_DFL):
            # left in place, a Ctrl-C outside the set would end rankrun with a traceback
            signal.signal(signal.SIGINT, signal.SIG_DFL)
        self.signums = wanted

    def note_as_it_arrives(self, signum: int) -> None:
        """Under the event loop's handler for ``signum`` (``loop.add_signal_handler``), note it the moment it arrives.

        The loop runs its callback only on its next turn, once it has read the signal from its wakeup fd;
        the agent may have returned and chosen its exit code by then (its way out gave the loop a turn only
        by accident, and since Python 3.12, where ``asyncio.wait_for`` no longer runs its awaitable in a task
        of its own, it does not). Python's handler runs in the main thread as soon as that runs Python code
        again. The loop's own Python-level handler is a no-op, there only so that the interpreter writes
        the signal to the loop's wakeup fd (``signal.set_wakeup_fd``), which it does whatever the
        Python-level handler is: this one takes its place, and the loop still wakes and runs its callback.
        """
        signal.signal(signum, self._note)
        signal.siginterrupt(signum, False)  # as the loop had it: a system call it interrupts is resumed

    def rearm(self, signum: int) -> None:
        """Catch ``signum`` here again (the event loop let go of it and left it at its default)."""
        while True:
            try:
                signal.signal(signum, self._record)
                return
            except KeyboardInterrupt:  # raised before installing: a SIGINT met Python's own handler meanwhile
                self.note(signal.SIGINT)

    def settle(self) -> None:
        """The exit code is chosen: from now on the handled signals are ignored, until the process is gone.

        Python's own exit puts every caught signal back to its default, so one arriving while the
        interpreter shuts down (a user repeating Ctrl-C) would end rankrun by that signal instead of
        with the code chosen; none can change the outcome any more.
        """
        for signum in self.signums:
            signal.signal(signum, signal.SIG_IGN)

    def restore(self) -> None:
        """Give every caught signal exactly the disposition it had before (for callers that live on: tests)."""
        for signum, inherited in self._inherited.items():
            signal.signal(signum, signal.SIG_DFL if inherited is None else inherited)
        self._inherited.clear()
        self.signums = ()

    def _note(self, signum: int, frame: FrameType | None) -> None:
        del frame
        self.note(signum)

    def _record(self, signum: int, frame: FrameType | None) -> None:
        del frame
        self.pending.append(signum)
        self.note(signum)
        if self.on_signal is not None:
            self.on_signal(signum)
