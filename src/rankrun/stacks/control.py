"""``rankrun --stacks [PID]``: ask a running launcher for the grouped stack report of its job, on demand.

Each launcher listens on a Unix socket in the abstract namespace, ``@rankrun-<uid>-<pid>``: nothing on disk to
leave behind after ``kill -9``, and a name any process of this machine can find from the PID. Only this user
gets an answer: the launcher checks the caller's ``SO_PEERCRED`` uid, and the caller checks that the socket's
owner is the very process (pid and uid) it asked for, so no other user's process can pose as a launcher.
A request is one line, ``stacks``; the answer is the report's lines, then the connection is closed. Taking the
sample never disturbs the job: the workers' faulthandler writes to its own file, not to their output.

Without a PID the launchers are found in ``/proc/net/unix`` by that name (this user's only); none or several
is an error naming them, on one line. A launcher that closes the connection without a word (its job ended as
it was asked) is an error too: the command always prints a report or says why there is none.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import socket
import struct
from collections.abc import Awaitable, Callable

from rankrun.errors import ArgumentError, UsageError

PREFIX = "rankrun-"
REQUEST = b"stacks\n"
ANSWER_TIMEOUT = 30.0  # seconds the caller waits for a report (sampling takes about a second at most)
ENDING_WAIT = 1.0  # seconds a launcher that closed without an answer is given to be seen gone
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def name(pid: int, uid: int | None = None) -> str:
    return f"{PREFIX}{os.getuid() if uid is None else uid}-{pid}"


def _peer(sock: socket.socket) -> tuple[int, int]:
    pid, uid, _ = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
    return pid, uid


async def serve(report: Callable[[], Awaitable[list[str]]]) -> asyncio.AbstractServer | None:
    """Listen for ``--stacks`` requests for this process; None if the name cannot be taken (then there is none)."""
    try:
        return await asyncio.start_unix_server(answerer(report, os.getuid()), path="\0" + name(os.getpid()))
    except OSError:
        return None


def answerer(report: Callable[[], Awaitable[list[str]]], uid: int) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter],
                                                                                Awaitable[None]]:
    """What serves one connection: the report for a caller whose ``SO_PEERCRED`` uid is ``uid`` (the launcher's
    own), nothing for any other (it is sent away unanswered)."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            sock = writer.get_extra_info("socket")
            if sock is None or _peer(sock)[1] != uid:
                return
            if await asyncio.wait_for(reader.readline(), ANSWER_TIMEOUT) != REQUEST:
                return
            writer.write(("\n".join(await report()) + "\n").encode())
            await writer.drain()
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            pass  # the caller went away: nothing to do
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    return answer


def launchers() -> list[int]:
    """This user's launchers on this machine, by their control sockets. A name's pid is the launcher's in its own
    PID namespace: one in a container that shares this network namespace is left out unless the process with that
    pid here holds the socket."""
    found: set[int] = set()
    mine = f"@{PREFIX}{os.getuid()}-"
    with contextlib.suppress(OSError), open("/proc/net/unix") as table:
        for line in table:
            fields = line.split()
            path = fields[-1] if len(fields) >= 8 else ""
            if path.startswith(mine) and path[len(mine):].isdigit() and _holds(int(path[len(mine):]), fields[6]):
                found.add(int(path[len(mine):]))
    return sorted(found)


def _holds(pid: int, inode: str) -> bool:
    """Whether process ``pid`` (in this PID namespace) has socket ``inode`` open."""
    target = f"socket:[{inode}]"
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    return True
    return False


def _ends(pid: int, within: float = ENDING_WAIT) -> bool:
    """Whether process ``pid`` has exited, or does within ``within`` s (its sockets close before it is gone)."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return True
    try:
        return bool(select.select([fd], [], [], within)[0])  # a pidfd is readable once its process has exited
    finally:
        os.close(fd)


def request(pid: int | None) -> str:
    """The report of the launcher ``pid`` (or of the only one); ``UsageError`` when there is none to ask."""
    if pid is None:
        running = launchers()
        if len(running) != 1:
            named = ", ".join(str(p) for p in running) or "none"
            raise ArgumentError(f"--stacks: which launcher? this user's rankrun launchers on this machine: {named}")
        pid = running[0]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(ANSWER_TIMEOUT)
        try:
            sock.connect("\0" + name(pid))
        except OSError:
            raise UsageError("--stacks", str(pid), "not a rankrun launcher of this user on this machine") from None
        if _peer(sock) != (pid, os.getuid()):
            raise UsageError("--stacks", str(pid), "that socket does not belong to the launcher with this PID")
        sock.sendall(REQUEST)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except TimeoutError:
        raise UsageError("--stacks", str(pid), f"the launcher did not answer within {ANSWER_TIMEOUT:g} s") from None
    finally:
        sock.close()
    if not chunks:  # it took the connection and closed it: its job ended as we asked (a report is never empty)
        raise UsageError("--stacks", str(pid), "the launcher exited before it answered (its job ended)" if _ends(pid) else
                         "the launcher closed the connection without an answer (its job is ending)")
    return b"".join(chunks).decode(errors="replace")
