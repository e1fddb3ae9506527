"""The rendezvous's keys and records: where each fact lives under ``/rankrun/<run id>/`` and how it is spelled.

Keys (all small; none is rewritten by more than one writer)::

    nodes/<node>            a node's description, written once when it joins, bound to its lease
    round                   the coordinator's word on the current round: number, phase, restarts, why
    assign/<node>           this node's place in a round: group rank, first rank, sizes, MASTER_ADDR/PORT
    result/<round>/<node>   how a node's workers ended in a round (and its failure, in a few lines)
    status                  who has joined so far, for the "3/4 nodes joined" line of waiting nodes
    closed                  the job is over: late joiners are turned away
    coordinator, job        a shared store (etcd): the elected coordinator, the job lease's id

Records travel as compact JSON objects (``dump``/``load``), never pickle.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from rankrun.rendezvous.round import NodeInfo, NodeRanks


@dataclass(frozen=True)
class Keys:
    root: str

    @classmethod
    def for_run(cls, run_id: str, prefix: str = "/rankrun") -> Keys:
        return cls(f"{prefix.rstrip('/')}/{run_id}/")

    @property
    def coordinator(self) -> str:
        """Who coordinates (a shared store: elected, bound to the winner's lease)."""
        return self.root + "coordinator"

    @property
    def job(self) -> str:
        """The job lease's id (a shared store: every key but the node keys lives on it)."""
        return self.root + "job"

    @property
    def nodes(self) -> str:
        return self.root + "nodes/"

    @property
    def round(self) -> str:
        return self.root + "round"

    @property
    def status(self) -> str:
        return self.root + "status"

    @property
    def closed(self) -> str:
        return self.root + "closed"

    @property
    def results(self) -> str:
        return self.root + "result/"

    def node(self, node_id: str) -> str:
        return self.nodes + node_id

    def assign(self, node_id: str) -> str:
        return self.root + "assign/" + node_id

    def result(self, round_: int, node_id: str) -> str:
        return f"{self.results}{round_}/{node_id}"


def dump(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def load(data: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(data)
    except ValueError:
        return {}
    return obj if isinstance(obj, dict) else {}


def node_from(value: bytes, joined: int, node_id: str) -> NodeInfo:
    d = load(value)
    return NodeInfo(node_id, joined, int(d.get("nproc", 1)), str(d.get("role", "default")), str(d.get("addr", "")),
                    str(d.get("host", "")), d.get("static_rank"), bool(d.get("is_host", False)))


def node_value(info: NodeInfo) -> bytes:
    d = asdict(info)
    del d["id"], d["joined"]
    return dump(d)


@dataclass(frozen=True)
class Assignment:
    round: int
    group_rank: int
    group_world_size: int
    ranks: NodeRanks
    master_addr: str
    master_port: int
    restarts: int


@dataclass(frozen=True)
class RoundWord:
    """The ``round`` key: what the coordinator says about the job now."""

    round: int
    phase: str  # "running", "stopping" (re-forming), "ended"
    restarts: int = 0
    reason: str = ""
    ok: bool = False  # for "ended"
    cause: str = ""  # for a failed end: the job's first failure, in a few lines
    stranded: bool = False  # for a failed end: too few nodes were left (not the workers' failure)

    def value(self) -> bytes:
        """The round key's value: what ``parse`` reads."""
        return dump(asdict(self))

    @classmethod
    def parse(cls, value: bytes) -> RoundWord:
        d = load(value)
        return cls(int(d.get("round", 0)), str(d.get("phase", "")), int(d.get("restarts", 0)), str(d.get("reason", "")),
                   bool(d.get("ok", False)), str(d.get("cause", "")), bool(d.get("stranded", False)))
