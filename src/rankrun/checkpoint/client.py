"""A rank's one connection to its node's keeper, and the kept memory it is handed: worker side, standard library only.

The first ``save`` or ``load`` of a process connects to the socket ``RANKRUN_CHECKPOINT`` names and says ``hello``; the
keeper checks that the caller is one of its workers (by the socket's peer pid: a rank's DataLoader child or a
subprocess is refused) and hands over the rank's header and two slots. Each slot is mapped once per process, as large
as the keeper reserved it (``MAP_POPULATE``: the page faults are paid at the mapping, not in the save).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import socket
import threading
from dataclasses import dataclass
from typing import Any

from rankrun.checkpoint import slots, wire


class KeptError(RuntimeError):
    """The keeper refused what this process asked (one line, the keeper's reason)."""


class NoRoom(KeptError):
    """The keeper has no room for a save: it said so on the launcher's console; the previous step stays kept."""


@dataclass
class Slot:
    fd: int
    capacity: int = 0  # bytes reserved by the keeper
    view: mmap.mmap | None = None  # mapped at ``capacity``


class Client:
    """The connection (from ``connect``), the rank's header mapped, its two slots."""

    def __init__(self, sock: socket.socket, info: dict[str, Any], fds: list[int]) -> None:
        self._sock, self.info = sock, info
        self.rank = int(info["rank"])
        self.world = int(info["world"])
        self.header = mmap.mmap(fds[0], slots.HEADER)
        self.slots = [Slot(fd, int(capacity)) for fd, capacity in zip(fds[1:], info["capacity"], strict=True)]
        self.lock = threading.Lock()  # one save at a time per process (never another rank's)

    def ask(self, kind: str, **body: Any) -> tuple[dict[str, Any], list[int]]:
        """One request and its answer (with the descriptors it carries)."""
        self._sock.send(wire.encode(kind, **body))
        data, fds, _, _ = socket.recv_fds(self._sock, wire.LIMIT, 4)
        if not data:
            raise KeptError("rankrun.checkpoint: the launcher's keeper is gone")
        return wire.decode(data), fds

    def tell(self, kind: str, **body: Any) -> None:
        """A notice that needs no answer; never blocks (a full socket drops it: the keeper reads the header anyway)."""
        with contextlib.suppress(BlockingIOError, BrokenPipeError):
            self._sock.send(wire.encode(kind, **body), socket.MSG_DONTWAIT)

    def mapped(self, index: int, need: int, step: int = -1) -> mmap.mmap:
        """Slot ``index`` mapped with at least ``need`` bytes reserved: the keeper is asked for room when it has less
        (for ``step``'s save, said when it refuses: ``NoRoom``)."""
        slot = self.slots[index]
        if slot.capacity < need:
            answer, _ = self.ask("room", slot=index, bytes=need, step=step)
            if answer["kind"] != "ok":
                raise NoRoom(str(answer.get("why", "no room")))
            slot.capacity = int(answer["capacity"])
            if slot.view is not None:
                slot.view.close()
                slot.view = None
        if slot.view is None:
            slot.view = mmap.mmap(slot.fd, slot.capacity, mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
        return slot.view


_client: Client | None = None
_pid = 0
_connecting = threading.Lock()


def connect() -> Client:
    """This process's client, connected on first use (again after a fork: a child is another process)."""
    global _client, _pid
    with _connecting:
        if _client is None or _pid != os.getpid():
            value = os.environ.get(wire.ENV)
            if not value:
                raise KeptError(f"rankrun.checkpoint: no {wire.ENV} in the environment: start the script with rankrun")
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
            try:
                sock.connect(wire.address(value))
                sock.send(wire.encode("hello", rank=int(os.environ.get("RANK", "-1"))))
                data, fds, _, _ = socket.recv_fds(sock, wire.LIMIT, 4)
            except OSError as exc:
                sock.close()
                raise KeptError(f"rankrun.checkpoint: the launcher's keeper cannot be reached ({exc})") from None
            answer = wire.decode(data) if data else {"kind": "refused", "why": "the keeper closed the connection"}
            if answer["kind"] != "slots":
                for fd in fds:
                    os.close(fd)
                sock.close()
                raise KeptError(f"rankrun.checkpoint: {answer.get('why', 'refused')}")
            _client, _pid = Client(sock, answer, fds), os.getpid()
        return _client


__all__ = ["Client", "KeptError", "NoRoom", "Slot", "connect"]
