"""Run by ``site`` in every Python worker rankrun starts: lets rankrun ask the worker for its stacks.

rankrun puts this folder first on the worker's ``PYTHONPATH`` and says in ``RANKRUN_STACKS_FILE``,
``RANKRUN_STACKS_SIGNAL`` and ``RANKRUN_STACKS_RUNNING`` where and on which signals to write a dump, in
``faulthandler``'s format. rankrun sends either signal to the main thread alone (``rankrun.proc.spawn.main_thread_kill``),
and which one depends on what the kernel says that thread is doing (``rankrun.stacks.sampler``):

- Blocked in a call (a collective, a sleep, a lock): ``faulthandler``, registered here on the first signal, writes
  the main thread's stack from C, in the signal handler. The thread is inside a C call, its frames still.
- Running: this file's Python handler, on the second signal, writes every thread's stack (``sys._current_frames``)
  to the second file. Python runs it between two bytecodes, holding the GIL, so no frame changes under it. A thread
  that runs but does not come back to bytecode within a fraction of a second holds the GIL in C (a regex): rankrun
  then asks ``faulthandler`` as for a blocked thread, and this handler's answer comes later, when the C call ends.

Why not ``faulthandler`` always, and of every thread: its handler reads frames as they are, with no lock. A thread
that runs Python may be entering a frame at that instant (CPython 3.11 and 3.12 set a thread's current C frame
before its first Python frame: a read there follows an unset pointer), and other threads' frames and thread states
change under a dump of every thread (torch's C++ threads make and free theirs to take the GIL). Workers died of
SIGSEGV in such dumps: ``bench/dump_safety.py`` measures it. No chaining: at start-up the first signal's previous
action is the default one, which ``chain=True`` would re-raise, ending the worker after its dump. The Python handler
restarts interrupted system calls (``siginterrupt(sig, False)``), as ``faulthandler``'s does.
The header line names the main thread (its id labels the dump: faulthandler names no thread in it), and says when
the interpreter came up (``up=``, ``time.monotonic()``: CLOCK_MONOTONIC, one clock for every process on the
machine, so the launcher reads it on its own clock): the rank's first sign of life for the start-up timeline
(``rankrun.agent.startup``), taken just before the interpreter runs the user's script (or, with ``-m``, finds
its module). It costs the worker nothing more than the header it already wrote: no other file, no other
syscall, one ``write`` of under 128 bytes to a file opened for appending, which the launcher reads only once it
ends in a newline (a read that races the write sees no line, and looks again later).

Then it leaves no trace: the two variables are removed, ``PYTHONPATH`` is put back as the user set it
(``RANKRUN_USER_PYTHONPATH``; absent: it was not set), this folder leaves ``sys.path``, and the user's own
``sitecustomize``, if there is one further on the path, runs in its place (an error in it is reported
by ``site`` as usual). Only builtin modules are imported here: every worker's start-up pays for this file.

With ``--straggler-window`` on, rankrun also names a file in ``RANKRUN_FR_FILE`` and a period in
``RANKRUN_FR_EVERY`` (seconds), both removed here too, and this file starts one side thread (``_thread``, builtin;
``threading`` would cost the start-up a millisecond, and the interpreter never waits for such a thread at exit).
Every period, once ``torch.distributed`` is loaded and initialized, it asks torch's Flight Recorder for what it
recorded (``torch._C._distributed_c10d._dump_fr_trace_json``, a private API, callable from a side thread while the
main thread is blocked in a collective; dump and parse cost about 30 µs of CPU per entry the buffer holds, most of it
holding the GIL, hence the small buffer) and appends one line per collective it had not written yet,
``<process group name> <collective_seq_id> <time_created_ns>``, all of a dump's lines in one ``write``: when each
collective was entered, by the wall clock, which ``rankrun.straggler.frfile`` reads. No torch, or torch not
initialized: the thread only sleeps, and neither the file nor its folder is made. Once initialized, the file's first
line says whether the recorder can be read (``rankrun-arrivals on``, or ``off`` with the error's type): the first
error from torch's API (a version without it, a changed format) is said so and ends the thread for good; nothing of it
ever reaches the worker. The buffer is ``TORCH_FR_BUFFER_SIZE``, which rankrun sets only where the user configured
no recorder of their own. The first collective's line ends the attempt's start-up in the goodput account
(``rankrun.agent.training``, which reads its own time, however late the line comes).
"""

import os
import sys
import time  # builtin, and already imported by the interpreter's start-up (zipimport): a dict look-up

TYPE_CHECKING = False  # typing is not imported at start-up: mypy reads the name as typing's
if TYPE_CHECKING:
    from types import FrameType


def _install() -> None:
    attach()
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    _chain()


def attach() -> None:
    """The per-worker part: the variables removed, ``PYTHONPATH`` put back, the dump channel and the arrivals thread.
    A worker forked by ``--preload`` (``rankrun.preload.child``) runs only this: its ``sitecustomize`` ran once in the
    preloading process, and this folder was never on its path."""
    path = os.environ.pop("RANKRUN_STACKS_FILE", "")
    signum = os.environ.pop("RANKRUN_STACKS_SIGNAL", "")
    running = os.environ.pop("RANKRUN_STACKS_RUNNING", "")
    user_path = os.environ.pop("RANKRUN_USER_PYTHONPATH", None)
    if user_path is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = user_path
    if path and signum:
        try:
            import _thread  # noqa: PLC0415 - builtin; threading would cost every worker a millisecond
            import faulthandler  # noqa: PLC0415

            channel = open(path, "ab", buffering=0)  # noqa: SIM115 - faulthandler keeps it for the process's life
            faulthandler.register(int(signum), file=channel, all_threads=False, chain=False)
            channel.write(f"rankrun-stacks main=0x{_thread.get_ident():016x} pid={os.getpid()} "
                          f"up={time.monotonic():.6f}\n".encode())
        except (OSError, ValueError, RuntimeError):
            pass  # no dumps for this worker: rankrun then shows its /proc state instead
    if path and signum and running:
        try:
            import _signal  # type: ignore[import-not-found]  # noqa: PLC0415 - builtin (signal.py imports enum: a millisecond)

            number, _, where = running.partition(" ")
            global _RUNNING_FILE  # noqa: PLW0603 - the handler's one setting, made once
            _RUNNING_FILE = where
            _signal.signal(int(number), _running_dump)
            _signal.siginterrupt(int(number), False)
        except (OSError, ValueError, RuntimeError):
            pass  # rankrun asks faulthandler instead (it never sends a signal the worker does not catch)
    arrivals = os.environ.pop("RANKRUN_FR_FILE", "")
    every = os.environ.pop("RANKRUN_FR_EVERY", "")
    if arrivals and every:
        try:
            period = float(every)
            if period > 0:
                import _thread  # noqa: PLC0415 - builtin (above: why not threading)

                _thread.start_new_thread(_arrivals, (arrivals, period))
        except (ValueError, RuntimeError):
            pass  # no arrivals from this worker: the straggler watch goes by its other signals


_RUNNING_FILE = ""
_DEPTH = 100  # frames a thread, as faulthandler's limit


def _running_dump(_signum: int, frame: "FrameType | None") -> None:
    """The Python handler (see the module docstring): every thread's stack, the main one (``frame``, where the
    handler interrupted it) first and ``Current``, appended to ``_RUNNING_FILE`` in one write. Never raises an error
    of its own into the worker (a ``KeyboardInterrupt`` that arrives meanwhile goes on)."""
    try:
        import _thread  # noqa: PLC0415 - builtin, imported already

        main = _thread.get_ident()
        out = []
        stacks = [(main, frame)] + [(ident, f) for ident, f in sys._current_frames().items() if ident != main]
        for ident, top in stacks:
            out.append(f"{'Current thread' if ident == main else 'Thread'} 0x{ident:016x} (most recent call first):\n")
            f, depth = top, 0
            while f is not None and depth < _DEPTH:
                code, line = f.f_code, f.f_lineno
                out.append(f'  File "{code.co_filename}", line {"???" if line is None else line} in {code.co_name}\n')
                f, depth = f.f_back, depth + 1
            out.append("  ...\n\n" if f is not None else "\n")
        fd = os.open(_RUNNING_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, "".join(out).encode(errors="replace"))
        finally:
            os.close(fd)
    except Exception:  # noqa: S110 - the worker's own work goes on, whatever the dump met
        pass


def _arrivals(path: str, every: float) -> None:
    """The side thread: every ``every`` s, the collectives torch's Flight Recorder holds that were not written yet,
    appended to ``path`` (see the module docstring). Ends at the first error, and never raises."""
    modules, sleep, finalizing = sys.modules, time.sleep, sys.is_finalizing
    last = -1  # the highest record_id seen: the recorder numbers its entries in order, across process groups
    out = None
    try:
        while True:
            sleep(every)
            dist = modules.get("torch.distributed")
            ready = getattr(dist, "is_initialized", None)  # None: no torch, or torch.distributed still importing
            if ready is None or finalizing() or not ready():
                continue
            first = out is None
            if out is None:  # initialized: the folder and the file now, none for a job without torch.distributed
                try:  # noqa: SIM105 - contextlib is not builtin
                    os.mkdir(path.rpartition("/")[0])
                except FileExistsError:
                    pass  # another rank's
                out = open(path, "ab", buffering=0)  # noqa: SIM115 - kept for the thread's life
            try:
                dump = modules["json"].loads(modules["torch"]._C._distributed_c10d._dump_fr_trace_json())
                entries = dump.get("entries", ())  # none recorded yet: no "entries" at all
                lines, seen = ["rankrun-arrivals on\n"] if first else [], last
                for entry in entries:
                    record_id = entry["record_id"]
                    if record_id > seen and not entry["is_p2p"]:
                        name = str(entry["process_group"][0]).replace("\n", " ")
                        lines.append(f"{name} {entry['collective_seq_id']} {entry['time_created_ns']}\n")
                    last = max(last, record_id)
            except Exception as exc:  # the recorder cannot be read here: said, so rankrun samples stacks instead
                out.write(f"rankrun-arrivals off {type(exc).__name__}\n".encode())
                return
            if lines:
                out.write("".join(lines).encode())
    except BaseException:  # the file went, or the interpreter is ending: stop, silently, for good
        return


def _chain() -> None:
    """The user's own ``sitecustomize``, further on the path, run in this one's place (it takes the name).

    Through the import system's own frozen modules, which every interpreter has loaded before ``site`` runs:
    ``importlib.util`` would pull in ``contextlib``, ``collections`` and ``functools``, ~4 ms of every worker's
    start-up (``-X importtime``).
    """
    finder = sys.modules["_frozen_importlib_external"].PathFinder  # importlib.machinery.PathFinder
    spec = finder.find_spec("sitecustomize", sys.path)
    if spec is None or spec.loader is None:
        return
    module = sys.modules["_frozen_importlib"].module_from_spec(spec)  # importlib.util.module_from_spec
    sys.modules["sitecustomize"] = module  # site's import then finds the user's module under the name
    spec.loader.exec_module(module)


if __name__ == "sitecustomize":  # run by site; imported by its full name (a forked worker), it only defines
    _install()
