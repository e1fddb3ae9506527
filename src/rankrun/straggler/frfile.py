"""A rank's collectives' arrivals, as its worker's shim appends them, read (pure but for the one file read).

With ``--straggler-window`` on, the shim in each Python worker (``rankrun/stacks/shim/sitecustomize.py``) dumps
torch's Flight Recorder every ``window/6`` s (at least 1 s) and appends to ``<attempt dir>/straggler/rank_<rank>.fr``
one line per collective it had not written yet (point-to-point operations left out), after a first line saying whether
the recorder can be read at all (``rankrun-arrivals on``, or ``rankrun-arrivals off <error type>``)::

    <process group name> <collective_seq_id> <time_created_ns>

``time_created_ns``: when the rank entered the collective, by its wall clock (``CLOCK_REALTIME``, nanoseconds). The
group's name and the sequence number name the same collective on every rank of the group, so the ranks' times for
one collective compare (across hosts, after the clock offsets of ``rankrun.straggler.clock``). A name may hold spaces,
never a newline: the line is split from the right. Each dump's lines come in one ``write``, so a reader meets at
most a last line still being written: ``read_new`` leaves it for the next read, and lines it cannot parse are
skipped. Entries the recorder's buffer dropped between two dumps (more collectives than the buffer holds) are
missing, not wrong: sequence numbers then have gaps.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Arrival:
    """One collective as one rank entered it."""

    group: str  # the process group's name (torch's ``pg_name``: "0" for the default group)
    seq: int  # its collective_seq_id in that group, the same on every member
    created_ns: int  # when this rank entered it: wall clock, ns since the epoch


STATUS = "rankrun-arrivals "  # the file's first line: "on", or "off <error type>" (the recorder cannot be read)


@dataclass(frozen=True, slots=True)
class Read:
    """What one read found: the arrivals, where to read next, and the shim's word on the recorder if it came."""

    arrivals: list[Arrival]
    offset: int
    status: str | None = None  # "on", "off <error type>"; None: not in this read


def read(path: Path | str, offset: int) -> Read:
    """The arrivals appended to ``path`` since byte ``offset``, and the offset to read from next time: just past the
    last whole line (a line still being written is read next time). No file yet (torch.distributed not initialized,
    or no torch): nothing, and ``offset`` unchanged."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except FileNotFoundError:
        return Read([], offset)
    end = data.rfind(b"\n") + 1
    arrivals, status = [], None
    for raw in data[:end].split(b"\n")[:-1]:
        line = raw.decode(errors="replace")
        if line.startswith(STATUS):
            status = line[len(STATUS):]
            continue
        arrival = parse_line(line)
        if arrival is not None:
            arrivals.append(arrival)
    return Read(arrivals, offset + end, status)


def read_new(path: Path | str, offset: int) -> tuple[list[Arrival], int]:
    """``read``'s arrivals and next offset."""
    found = read(path, offset)
    return found.arrivals, found.offset


def parse_line(line: str) -> Arrival | None:
    """One line (without its newline) as an ``Arrival``; None for a line that is not one."""
    parts = line.rsplit(" ", 2)
    if len(parts) != 3 or not parts[0]:
        return None
    try:
        return Arrival(parts[0], int(parts[1]), int(parts[2]))
    except ValueError:
        return None
