"""A failed ``rankrun.launch`` job's failures on every node: ``WorkerError.failures`` lists the failed ranks of the
whole job, and ``__cause__`` is the job's root cause, wherever it ran.

A node whose workers failed publishes, before it reports the failure, one key for itself,
``failures/<round>/<group rank>``: its node id, its host, its own first failure, and each failed rank's exit
status and ``ErrorRecord`` (type, message, traceback, the exception pickled), at most ``VALUE_LIMIT`` bytes in all
(the pickled exceptions go first, then the messages and tracebacks of every rank but the node's first failure).
When the job ends failed, every node reads those keys of the last round into its caller's results directory:
``<rank>.error`` as the worker itself writes it, ``<rank>.failed`` with the status and host, and ``root`` naming
the job's first failure: the first failure of the node whose report the coordinator read first (the one the
failure report names).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

from rankrun.api.results import ROOT, ErrorRecord, write_whole
from rankrun.api.values import VALUE_LIMIT, forget_the_others
from rankrun.rendezvous.keys import Keys
from rankrun.store.api import Store, get_many

TAIL = 64 << 10  # characters of a message or traceback kept when a node's failures do not fit whole


def node_failures(node_id: str, host: str, root: int | None, failed: list[tuple[int, int]], results: Path) -> bytes:
    """One node's key: its failed ranks ((rank, status) each) with what their workers recorded, fitted to VALUE_LIMIT."""
    records: list[dict[str, object]] = []
    for rank, status in failed:
        path = results / f"{rank}.error"
        error = ErrorRecord.parse(path.read_bytes()) if path.exists() else None
        records.append({"rank": rank, "status": status, "exc_type": error.exc_type if error else "",
                        "message": error.message if error else "", "traceback": error.traceback if error else "",
                        "pickled": base64.b64encode(error.pickled).decode() if error and error.pickled else ""})
    node: dict[str, object] = {"node": node_id, "host": host, "root": root, "failures": records}
    value = _json(node)
    for fit in (_without_the_exception, _the_first_failures_text_only):  # what goes first when it does not fit
        if len(value) <= VALUE_LIMIT:
            break
        for record in records:
            fit(record, first=record["rank"] == root)
        value = _json(node)
    return value


def _json(node: dict[str, object]) -> bytes:
    return json.dumps(node, separators=(",", ":")).encode()


def _without_the_exception(record: dict[str, object], *, first: bool) -> None:
    del first
    record["pickled"] = ""


def _the_first_failures_text_only(record: dict[str, object], *, first: bool) -> None:
    record["message"] = str(record["message"])[-TAIL:] if first else ""
    record["traceback"] = str(record["traceback"])[-TAIL:] if first else ""


async def publish(store: Store, keys: Keys, round_: int, group_rank: int, value: bytes, *, lease: int) -> list[str]:
    """This node's failures of round ``round_`` into the store; the key written."""
    await store.put(keys.failures(round_, group_rank), value, lease=lease)
    return [keys.failures(round_, group_rank)]


async def collect(store: Store, keys: Keys, round_: int, group_world_size: int, mine: range, *, results: Path) -> None:
    """Every node's failures of round ``round_`` into ``results`` (this node's own ranks are there already), and the
    job's first failure."""
    forget_the_others(results, mine)
    (results / ROOT).unlink(missing_ok=True)
    entries = await get_many(store, [keys.failures(round_, g) for g in range(group_world_size)])
    nodes = [json.loads(e.value) for e in entries if e is not None]
    reports = await get_many(store, [keys.result(round_, str(node.get("node"))) for node in nodes])
    first = min(((r.mod_revision, n) for r, n in zip(reports, nodes, strict=True) if r is not None),
                key=lambda pair: pair[0], default=None)
    if first is not None and first[1].get("root") is not None:
        write_whole(results / ROOT, json.dumps({"rank": first[1]["root"]}).encode())
    for node in nodes:
        for record in node.get("failures", []):
            rank = int(record["rank"])
            if rank in mine:
                continue
            pickled = base64.b64decode(record["pickled"]) if record.get("pickled") else None
            error = ErrorRecord(str(record["exc_type"]), str(record["message"]), str(record["traceback"]), pickled)
            if error.exc_type or error.traceback:
                write_whole(results / f"{rank}.error", error.value())
            write_whole(results / f"{rank}.failed", json.dumps({"status": record["status"], "host": node.get("host")}).encode())
