"""A worker's stack dump, read: what ``faulthandler`` writes, parsed (pure).

The shim (``rankrun.stacks.shim``) registers ``faulthandler.register(signum, file, all_threads=False)`` and rankrun
sends the signal to the main thread, so a dump is that thread's stack, with no thread named (CPython 3.11 to 3.13)::

    Stack (most recent call first):
      File "/tmp/train.py", line 6 in step
      File "/tmp/train.py", line 9 in <module>

The shim writes ``rankrun-stacks main=0x... pid=N up=T`` once, first, so the main thread's id is known (and when the
interpreter came up, ``up_time``), and the stack is labelled with it. A dump of every thread (``all_threads=True``,
which rankrun no longer asks for: why in the shim's docstring) is read too, each thread under its own header::

    Thread 0x00007f75d4b296c0 (most recent call first):
      File "/tmp/train.py", line 3 in load
      File "/usr/lib/python3.11/threading.py", line 982 in run

    Current thread 0x00007f75d588bb80 (most recent call first):
      File "/tmp/train.py", line 6 in step

``Current`` is whichever thread ran the signal handler, not necessarily the main thread. Frames arrive innermost first;
``Frame`` tuples here are outermost first, the order of the report.
A dump cut short (the process died while writing) keeps the threads it finished. The shim's own side thread (the
straggler watch's arrivals, ``_arrivals`` in ``stacks/shim/sitecustomize.py``) is rankrun's, not the job's: it is left
out, so a report shows the user's threads only. So are the outermost frames of a worker forked by ``--preload``
(``rankrun/preload/__main__.py``'s and ``child.py``'s, under the user's code), unless nothing else is there yet.
"""

from __future__ import annotations

import re

from rankrun.record import record

HEADER = "rankrun-stacks"
_HEADER = re.compile(r"^rankrun-stacks main=0x([0-9a-f]+) pid=(\d+)(?: up=(\d+\.\d+))?$")
_THREAD = re.compile(r"^(Current thread|Thread) 0x([0-9a-f]+)(?: \[[^\]]*\])? \(most recent call first\):$")
_STACK = "Stack (most recent call first):"  # one thread's dump (all_threads=False): the thread that took the signal
_FRAME = re.compile(r'^  File "(.*)", line (\d+|\?\?\?) in (.*)$')
_OWN_THREAD = ("/stacks/shim/sitecustomize.py", "_arrivals")  # the outermost frame of the shim's side thread
_PRELOAD = "/rankrun/preload/"  # a forked worker's outermost frames: the preloading process's, under the user's


@record
class Frame:
    file: str
    line: int  # 0 when faulthandler did not know it
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


@record
class ThreadStack:
    ident: int
    main: bool
    frames: tuple[Frame, ...]  # outermost first
    truncated: bool = False  # faulthandler stopped at its depth limit ("...")


@record
class Dump:
    threads: tuple[ThreadStack, ...]

    @property
    def main(self) -> ThreadStack | None:
        return next((t for t in self.threads if t.main), None)

    @property
    def others(self) -> tuple[ThreadStack, ...]:
        return tuple(t for t in self.threads if not t.main)


def main_thread(header: str) -> int | None:
    """The main thread's id from the shim's header line, or None if ``header`` is not one."""
    m = _HEADER.match(header.strip())
    return int(m.group(1), 16) if m else None


def up_time(header: str) -> float | None:
    """When the worker's interpreter came up (its monotonic clock, the machine's), from a whole header line (one that
    ends in a newline: a line still being written is not one); None otherwise."""
    m = _HEADER.match(header.rstrip("\n")) if header.endswith("\n") else None
    return float(m.group(3)) if m and m.group(3) else None


def parse(text: str, main_ident: int | None) -> Dump:
    """The threads of one dump. Without ``main_ident`` the thread faulthandler calls current is taken as main."""
    threads: list[ThreadStack] = []
    ident: int | None = None
    current = False
    frames: list[Frame] = []
    truncated = False

    def close() -> None:
        if ident is not None:
            main = ident == main_ident if main_ident is not None else current
            outermost = frames[-1] if frames else None
            if not main and outermost is not None and outermost.file.endswith(_OWN_THREAD[0]) \
                    and outermost.function == _OWN_THREAD[1]:
                return  # rankrun's own thread
            ordered = tuple(reversed(frames))
            ours = next((i for i, frame in enumerate(ordered) if _PRELOAD not in frame.file), len(ordered))
            threads.append(ThreadStack(ident, main, ordered[ours:] if ours < len(ordered) else ordered, truncated))

    for line in text.splitlines():
        if m := _THREAD.match(line):
            close()
            ident, current, frames, truncated = int(m.group(2), 16), m.group(1) == "Current thread", [], False
        elif line == _STACK:
            close()
            ident, current, frames, truncated = main_ident or 0, True, [], False
        elif ident is not None and (f := _FRAME.match(line)):
            frames.append(Frame(f.group(1), 0 if f.group(2) == "???" else int(f.group(2)), f.group(3)))
        elif ident is not None and line.strip() == "...":
            truncated = True
    close()
    return Dump(tuple(threads))
