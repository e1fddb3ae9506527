"""Every rank's value on every node: a ``rankrun.launch`` job's values travel between its agents through the
rendezvous store (the embedded store, or etcd).

A node whose workers all returned publishes, before it reports success, one key per local rank,
``values/<round>/<rank>``: the pickled value itself when it is at most ``VALUE_LIMIT`` bytes (what one etcd
request carries by default, with room to spare), else a pointer to a copy spilled into the run's log directory
(``<log_dir>/<run>/values/<rank>.value``; kept, and readable by every node when ``log_dir`` is a shared file system).
The coordinator ends a job well only once every node has reported success, so when a node reads that end every
other node's keys are there: it reads them, one ``get`` per rank, into its caller's results directory
(``<rank>.value``, or ``<rank>.at`` for a spilled one, which the caller reads from where it lies) and only then
leaves. The keys live on the job's lease (etcd) or in the host's memory, and go with the job.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

from rankrun.api.results import KINDS, write_whole
from rankrun.rendezvous.keys import Keys
from rankrun.store.api import Store, get_many

VALUE_LIMIT = 1 << 20  # bytes of one pickled value that travel through the store; a larger one is spilled to a file


def encode(rank: int, host: str, data: bytes | None, *, size: int = 0, path: str = "", why: str = "") -> bytes:
    """One rank's key: a JSON header line, then the pickled value (``data``), or nothing when it was spilled (to
    ``path``; ``why`` not, when it could not be)."""
    header: dict[str, object] = {"rank": rank, "host": host}
    if data is None:
        header |= {"size": size, "path": path, "why": why}
    return json.dumps(header, separators=(",", ":")).encode() + b"\n" + (data or b"")


def decode(value: bytes) -> tuple[dict[str, object], bytes]:
    header, _, data = value.partition(b"\n")
    found = json.loads(header)
    return (found if isinstance(found, dict) else {}), data


def spilled(header: dict[str, object]) -> bool:
    return "path" in header


def pointer_text(header: dict[str, object]) -> bytes:
    """What ``<rank>.at`` holds: where a spilled value lies, its size and its node (``read_spilled`` reads it)."""
    return json.dumps({k: header.get(k) for k in ("rank", "host", "size", "path", "why")}).encode()


def read_spilled(at: Path) -> bytes:
    """A spilled value, from the file its ``<rank>.at`` names; ``OSError`` saying why not, and how to fix it."""
    where = json.loads(at.read_text())
    rank, host, size, path = where.get("rank"), where.get("host"), int(where.get("size") or 0), str(where.get("path") or "")
    too_big = (f"rank {rank}'s value ({size:,} bytes, on {host}) is larger than the {VALUE_LIMIT:,} bytes a value "
               "may take through the rendezvous store")
    if not path:
        why = where.get("why") or "its node had no log_dir to spill it to"
        raise OSError(f"{too_big}, and {why}: give log_dir= a directory every node shares, or return less (a path to "
                      "what the worker saved)")
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise OSError(f"{too_big}; it was spilled to {path}, which this node cannot read ({exc.strerror}): give log_dir= "
                      "a directory every node shares") from None


async def publish(store: Store, keys: Keys, round_: int, ranks: range, *, results: Path, spill_dir: Path | None,
                  host: str, lease: int) -> list[str]:
    """This node's values of round ``round_`` into the store (those over ``VALUE_LIMIT`` spilled, when it can); the
    keys written."""
    written = []
    for rank in ranks:
        source = results / f"{rank}.value"
        try:
            size = source.stat().st_size
        except FileNotFoundError:  # the worker exited 0 without returning (os._exit): no value, as on one node
            continue
        if size <= VALUE_LIMIT:
            value = encode(rank, host, source.read_bytes())
        elif spill_dir is None:
            value = encode(rank, host, None, size=size)
        else:
            try:
                value = encode(rank, host, None, size=size, path=str(await asyncio.to_thread(_spill, source, spill_dir, rank)))
            except OSError as exc:  # a full or read-only log_dir: the job still succeeded, the other nodes say why
                value = encode(rank, host, None, size=size, why=f"its node could not spill it to {spill_dir}: {exc}")
        await store.put(keys.value(round_, rank), value, lease=lease)
        written.append(keys.value(round_, rank))
    return written


def _spill(source: Path, spill_dir: Path, rank: int) -> Path:
    spill_dir.mkdir(parents=True, exist_ok=True)
    target = spill_dir / f"{rank}.value"
    target.unlink(missing_ok=True)
    try:
        os.link(source, target)  # the same file system: no copy
    except OSError:
        shutil.copyfile(source, target)
    return target


def forget_the_others(results: Path, mine: range) -> None:
    """Remove what ``results`` holds of ranks not on this node now: an earlier round's, before ranks moved (a node
    joined or left), or the other nodes' of an earlier end."""
    for path in results.iterdir():
        rank, dot, kind = path.name.partition(".")
        if dot and kind in KINDS and rank.isdigit() and int(rank) not in mine:
            path.unlink(missing_ok=True)


async def collect(store: Store, keys: Keys, round_: int, world_size: int, mine: range, *, results: Path) -> None:
    """The other nodes' values of round ``round_`` into ``results``, in place of anything it held of their ranks."""
    forget_the_others(results, mine)
    others = [rank for rank in range(world_size) if rank not in mine]
    entries = await get_many(store, [keys.value(round_, rank) for rank in others])
    for rank, entry in zip(others, entries, strict=True):
        if entry is None:  # that worker returned no value
            continue
        header, data = decode(entry.value)
        if spilled(header):
            write_whole(results / f"{rank}.at", pointer_text(header))
        else:
            write_whole(results / f"{rank}.value", data)
