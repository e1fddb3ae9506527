"""The rendezvous's keys and records: where each fact lives under ``/rankrun/<run id>/`` and how it is spelled.

Keys (small, but for a ``rankrun.launch`` job's values). Who writes them: a node its own (``nodes/``, ``result/``,
``unhealthy/``, ``stacks/answer/``, ``values/``, ``failures/``, ``netcheck/<round>/endpoint|link|re/``,
``straggler/<round>/ask|window/``, ``kept/<round>/held|peer/``), a round's group rank 0 ``kept/<round>/plan``; the
coordinator ``round``, ``assign/``, ``status``, ``closed``, ``blocklist/``,
``netcheck/<round>/reprobe|verdict``, ``straggler/<round>/time/`` and ``straggler/<round>/verdict``, and the
``unhealthy/`` key of a node its network check found unhealthy (on etcd, each elected coordinator in turn); whichever
node wins a compare-and-set, ``coordinator`` (the election) and ``job`` (the first to join); any node ``stacks/ask``
(a stall's ask by compare-and-set, ``rankrun --stacks``'s by a plain write); the asker ``stacks/report``::

    nodes/<node>            a node's description, written once when it joins, bound to its lease (and, when its
                            --health-check failed before it joined, why: the coordinator never counts it)
    round                   the coordinator's word on the current round: number, phase, restarts, why
    assign/<node>           this node's place in a round: group rank, first rank, sizes, MASTER_ADDR/PORT; or that
                            it waits as a spare; or that it is excluded from the job, and why
    result/<round>/<node>   how a node's workers ended in a round (and its failure, in a few lines)
    status                  who has joined so far, for the "3/4 nodes joined" line of waiting nodes
    closed                  the job is over: late joiners are turned away
    unhealthy/<node>        a node's own word that it is unhealthy, and why (bound to its lease)
    blocklist/<host>@<addr> a node excluded from the job (hostname, advertised address): why and when; a launcher of
                            that node that comes back is refused at join. As long-lived as the job's keys
    coordinator, job        a shared store (etcd): the elected coordinator, the job lease's id
    stacks/ask              somebody wants every node's stacks (a stall, or ``rankrun --stacks``)
    stacks/answer/<node>    a node's grouped samples for the latest ask, bound to its lease
    stacks/report           the asker's report of the whole job, which every node prints (a stall)
    values/<round>/<rank>   ``rankrun.launch``: a rank's value (up to 1 MiB) or where it was spilled
    failures/<round>/<g>    ``rankrun.launch``: the failures of the node of group rank g (up to 1 MiB)
    netcheck/<round>/endpoint/<g>  ``--network-check``: where the node of group rank g serves its probe endpoint
    netcheck/<round>/link/<g>      its measure of its ring neighbour (group rank g + 1, wrapping)
    netcheck/<round>/reprobe       the coordinator: the suspects' group ranks, each with its known-good partner
    netcheck/<round>/re/<g>        a suspect's measure of its partner
    netcheck/<round>/verdict       the coordinator: the group ranks found unhealthy, each with its line (or nobody)
    straggler/<round>/ask/<node>     ``--straggler-window``, several nodes: a node asks the host's clock (a count)
    straggler/<round>/time/<node>    the host's clock as it answered that count
    straggler/<round>/window/<node>  a node's latest window (``straggler.summary``), on the host's clock
    straggler/<round>/verdict        the host: the job's stragglers now (``straggler.summary``), which every node says
    kept/<round>/held/<g>   ``rankrun.checkpoint``: what the node of group rank g holds of the ranks' kept steps
    kept/<round>/peer/<g>   where that node serves the neighbour's copy: the node of group rank g - 1 puts its steps there
    kept/<round>/plan       the round's group rank 0: the step the round resumes from, and where each rank's is read

Each rendezvous record is written and read here, and only here: ``node_value``/``node_from``, ``RoundWord``,
``Assignment``, ``Spare`` and ``Excluded`` (``place_from``), ``result_value``/``result_from``, ``Status``,
``closed_value``/``closed_ok``, ``Blocked``, ``unhealthy_value``/``unhealthy_from``, and the network check's
``endpoint_value``, ``link_value``, ``reprobe_value``, ``verdict_value`` (each with its ``_from``). They travel as compact JSON
objects, never pickle. The ``stacks/`` records are the stacks exchange's (``rankrun.stacks.wire``), the
``straggler/`` ones the straggler watch's (``rankrun.straggler.summary``), the ``kept/`` ones kept progress's
(``rankrun.checkpoint.plan``); the ``values/``
and ``failures/`` ones the Python API's (``rankrun.api.values``, ``rankrun.api.failures``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from rankrun.health.outliers import Link
from rankrun.rendezvous.round import NodeInfo, NodeRanks, Phase, Result


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

    @property
    def assigns(self) -> str:
        return self.root + "assign/"

    def assign(self, node_id: str) -> str:
        return self.assigns + node_id

    @property
    def run_id(self) -> str:
        return self.root.rstrip("/").rsplit("/", 1)[-1]

    @property
    def unhealthy(self) -> str:
        return self.root + "unhealthy/"

    def unhealthy_node(self, node_id: str) -> str:
        return self.unhealthy + node_id

    @property
    def blocklist(self) -> str:
        return self.root + "blocklist/"

    def blocked(self, host: str, addr: str) -> str:
        """A node's place on the blocklist: its hostname and the address it advertises (two nodes may share either)."""
        return f"{self.blocklist}{host}@{addr}"

    def result(self, round_: int, node_id: str) -> str:
        return f"{self.results}{round_}/{node_id}"

    @property
    def stacks_ask(self) -> str:
        return self.root + "stacks/ask"

    @property
    def stacks_answers(self) -> str:
        return self.root + "stacks/answer/"

    def stacks_answer(self, node_id: str) -> str:
        return self.stacks_answers + node_id

    @property
    def stacks_report(self) -> str:
        return self.root + "stacks/report"

    def value(self, round_: int, rank: int) -> str:
        """A ``rankrun.launch`` job's value of one rank in one round (``rankrun.api.values``)."""
        return f"{self.root}values/{round_}/{rank}"

    def netcheck(self, round_: int) -> str:
        """``--network-check``'s keys of one round (``netcheck_endpoint`` ... ``netcheck_verdict`` are under it)."""
        return f"{self.root}netcheck/{round_}/"

    def netcheck_endpoints(self, round_: int) -> str:
        return f"{self.netcheck(round_)}endpoint/"

    def netcheck_endpoint(self, round_: int, group_rank: int) -> str:
        return f"{self.netcheck_endpoints(round_)}{group_rank}"

    def netcheck_links(self, round_: int) -> str:
        return f"{self.netcheck(round_)}link/"

    def netcheck_link(self, round_: int, group_rank: int) -> str:
        return f"{self.netcheck_links(round_)}{group_rank}"

    def netcheck_reprobe(self, round_: int) -> str:
        return f"{self.netcheck(round_)}reprobe"

    def netcheck_reprobes(self, round_: int) -> str:
        return f"{self.netcheck(round_)}re/"

    def netcheck_re(self, round_: int, group_rank: int) -> str:
        return f"{self.netcheck_reprobes(round_)}{group_rank}"

    def netcheck_verdict(self, round_: int) -> str:
        return f"{self.netcheck(round_)}verdict"

    def kept_holdings(self, round_: int) -> str:
        """``rankrun.checkpoint``: every node's holdings of one round (``kept_held``), and its plan (``kept_plan``)."""
        return f"{self.root}kept/{round_}/held/"

    def kept_held(self, round_: int, group_rank: int) -> str:
        return f"{self.kept_holdings(round_)}{group_rank}"

    def kept_peer(self, round_: int, group_rank: int) -> str:
        """Where the node of group rank g serves the neighbour's copy (``checkpoint.peer``) in this round."""
        return f"{self.root}kept/{round_}/peer/{group_rank}"

    def kept_plan(self, round_: int) -> str:
        return f"{self.root}kept/{round_}/plan"

    def straggler(self, round_: int) -> str:
        """``--straggler-window``'s keys of one round (``straggler_ask`` ... ``straggler_verdict`` are under it)."""
        return f"{self.root}straggler/{round_}/"

    def straggler_asks(self, round_: int) -> str:
        return f"{self.straggler(round_)}ask/"

    def straggler_ask(self, round_: int, node_id: str) -> str:
        return self.straggler_asks(round_) + node_id

    def straggler_time(self, round_: int, node_id: str) -> str:
        return f"{self.straggler(round_)}time/{node_id}"

    def straggler_windows(self, round_: int) -> str:
        return f"{self.straggler(round_)}window/"

    def straggler_window(self, round_: int, node_id: str) -> str:
        return self.straggler_windows(round_) + node_id

    def straggler_verdict(self, round_: int) -> str:
        return f"{self.straggler(round_)}verdict"

    def goodput(self, round_: int) -> str:
        """Each node's goodput account once its workers of a round ended (``goodput_of``), for the host's job line."""
        return f"{self.root}goodput/{round_}/"

    def goodput_of(self, round_: int, group_rank: int) -> str:
        return f"{self.goodput(round_)}{group_rank}"

    def failures(self, round_: int, group_rank: int) -> str:
        """A failed ``rankrun.launch`` job's failures on one node in one round (``rankrun.api.failures``)."""
        return f"{self.root}failures/{round_}/{group_rank}"


def _dump(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _load(data: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(data)
    except ValueError:
        return {}
    return obj if isinstance(obj, dict) else {}


def node_from(value: bytes, joined: int, node_id: str) -> NodeInfo:
    d = _load(value)
    sick = d.get("unhealthy")
    return NodeInfo(node_id, joined, int(d.get("nproc", 1)), str(d.get("role", "default")), str(d.get("addr", "")),
                    str(d.get("host", "")), d.get("static_rank"), bool(d.get("is_host", False)),
                    str(sick) if sick is not None else None)


def node_value(info: NodeInfo) -> bytes:
    d = asdict(info)
    del d["id"], d["joined"]
    if info.unhealthy is None:  # a healthy node's key stays as it was: a join costs a few hundred bytes
        del d["unhealthy"]
    return _dump(d)


@dataclass(frozen=True)
class Assignment:
    """A node's ``assign/<node>`` key: its place in a round (written by the coordinator, read by that node only)."""

    round: int
    group_rank: int
    group_world_size: int
    ranks: NodeRanks
    master_addr: str
    master_port: int
    restarts: int

    def value(self) -> bytes:
        # spelled out, not ``asdict`` (which deep-copies field by field): the coordinator writes one per node a round
        r = self.ranks
        return _dump({"round": self.round, "group_rank": self.group_rank, "group_world_size": self.group_world_size,
                      "ranks": {"base_rank": r.base_rank, "world_size": r.world_size, "base_role_rank": r.base_role_rank,
                                "role_world_size": r.role_world_size},
                      "master_addr": self.master_addr, "master_port": self.master_port, "restarts": self.restarts})


@dataclass(frozen=True)
class Spare:
    """The same key when the round is full: this node waits, and takes the place of the first node to leave."""

    round: int

    def value(self) -> bytes:
        return _dump({"round": self.round, "spare": True})


@dataclass(frozen=True)
class Excluded:
    """The same key, for good: this node is excluded from the job (``reason``), since ``at`` (wall-clock seconds)."""

    reason: str
    at: float

    def value(self) -> bytes:
        return _dump({"excluded": True, "reason": self.reason, "at": self.at})


def place_from(value: bytes) -> Assignment | Spare | Excluded:
    """An ``assign/<node>`` value, as ``Assignment.value``, ``Spare.value`` or ``Excluded.value`` wrote it."""
    d = _load(value)
    if d.get("excluded"):
        return Excluded(str(d.get("reason", "")), float(d.get("at", 0.0)))
    if d.get("spare"):
        return Spare(int(d.get("round", 0)))
    r = d["ranks"]
    ranks = NodeRanks(int(r["base_rank"]), int(r["world_size"]), int(r["base_role_rank"]), int(r["role_world_size"]))
    return Assignment(int(d["round"]), int(d["group_rank"]), int(d["group_world_size"]), ranks, str(d["master_addr"]),
                      int(d["master_port"]), int(d.get("restarts", 0)))


@dataclass(frozen=True)
class RoundWord:
    """The ``round`` key: what the coordinator says about the job now."""

    round: int
    phase: Phase  # RUNNING, FORMING (the round was stopped: re-forming), ENDED
    restarts: int = 0
    reason: str = ""
    ok: bool = False  # for "ended"
    cause: str = ""  # for a failed end: the job's first failure, in a few lines
    stranded: bool = False  # for a failed end: too few nodes were left (not the workers' failure)
    # What ended the round before (re-forming, and the next round's running word) or this one (ended), for every
    # node's events: the first failure's root cause (its ``failure`` event's keys), the nodes lost.
    failure: dict[str, Any] | None = None
    lost: tuple[str, ...] = ()
    excluded: tuple[tuple[str, str], ...] = ()  # every node the job excluded so far (named as lost ones are), with why

    def value(self) -> bytes:
        """The round key's value: what ``parse`` reads."""
        return _dump(asdict(self) | {"phase": self.phase.value, "lost": list(self.lost),
                                     "excluded": [{"node": n, "reason": r} for n, r in self.excluded]})

    @classmethod
    def parse(cls, value: bytes) -> RoundWord:
        d = _load(value)
        failure = d.get("failure")
        return cls(int(d.get("round", 0)), _phase(d.get("phase")), int(d.get("restarts", 0)), str(d.get("reason", "")),
                   bool(d.get("ok", False)), str(d.get("cause", "")), bool(d.get("stranded", False)),
                   dict(failure) if isinstance(failure, dict) else None, tuple(str(n) for n in d.get("lost", ())),
                   tuple((str(e.get("node", "")), str(e.get("reason", ""))) for e in d.get("excluded", ())
                         if isinstance(e, dict)))


def result_value(ok: bool, summary: str = "", root: Mapping[str, object] | None = None, *, stall: str | None = None,
                 blame: str | None = None) -> bytes:
    """A node's ``result/<round>/<node>`` key: how its workers ended (its failure in a few lines, and its root cause's
    event keys); for a stall (``--hang-action fail``), its cause and the node its report blames. Keys a reader does
    not know are ignored: an older coordinator reads a stall as any failure (blaming its node)."""
    return _dump({"ok": ok, "summary": summary} | ({"root": dict(root)} if root is not None else {})
                 | ({"stall": stall} if stall is not None else {}) | ({"blame": blame} if blame else {}))


def result_from(value: bytes, revision: int) -> Result:
    d = _load(value)
    root, stall, blame = d.get("root"), d.get("stall"), d.get("blame")
    return Result(bool(d.get("ok")), revision, str(d.get("summary", "")), dict(root) if isinstance(root, dict) else None,
                  stall=stall if isinstance(stall, str) else None, blame=blame if isinstance(blame, str) and blame else None)


@dataclass(frozen=True)
class Blocked:
    """A ``blocklist/<host>@<addr>`` key: that node was excluded from job ``run`` at ``at`` (wall-clock), for ``reason``."""

    run: str
    reason: str
    at: float

    def value(self) -> bytes:
        return _dump(asdict(self))

    @classmethod
    def parse(cls, value: bytes) -> Blocked:
        d = _load(value)
        return cls(str(d.get("run", "")), str(d.get("reason", "")), float(d.get("at", 0.0)))


def unhealthy_value(reason: str) -> bytes:
    """A node's ``unhealthy/<node>`` key: its own word that it cannot run workers, and why."""
    return _dump({"reason": reason})


def unhealthy_from(value: bytes) -> str:
    return str(_load(value).get("reason", "")) or "no reason given"


def endpoint_value(addr: str, port: int) -> bytes:
    """A ``netcheck/<round>/endpoint/<g>`` key: where that node's probe endpoint listens."""
    return _dump({"addr": addr, "port": port})


def endpoint_from(value: bytes) -> tuple[str, int]:
    d = _load(value)
    return str(d.get("addr", "")), int(d.get("port", 0))


def link_value(link: Link) -> bytes:
    """A ``netcheck/<round>/link/<g>`` or ``re/<g>`` key: one measured link (no answer: an infinite round trip, which
    JSON spells as null)."""
    rtt = None if math.isinf(link.rtt) else link.rtt
    return _dump({"rtt": rtt, "forward": link.forward, "backward": link.backward})


def link_from(value: bytes) -> Link:
    d = _load(value)
    rtt = d.get("rtt")
    return Link(math.inf if rtt is None else float(rtt), float(d.get("forward", 0.0)), float(d.get("backward", 0.0)))


def reprobe_value(partners: Mapping[int, int]) -> bytes:
    """The ``netcheck/<round>/reprobe`` key: each suspect's group rank → the known-good one it measures."""
    return _dump({"partners": {str(g): p for g, p in partners.items()}})


def reprobe_from(value: bytes) -> dict[int, int]:
    partners = _load(value).get("partners", {})
    return {int(g): int(p) for g, p in partners.items()} if isinstance(partners, dict) else {}


def verdict_value(unhealthy: Mapping[int, str]) -> bytes:
    """The ``netcheck/<round>/verdict`` key: the group ranks the check found unhealthy, each with its line (empty:
    nobody; the round goes on)."""
    return _dump({"unhealthy": {str(g): line for g, line in unhealthy.items()}})


def verdict_from(value: bytes) -> dict[int, str]:
    unhealthy = _load(value).get("unhealthy", {})
    return {int(g): str(line) for g, line in unhealthy.items()} if isinstance(unhealthy, dict) else {}


def closed_value(ok: bool) -> bytes:
    """The ``closed`` key: the job is over (and whether it succeeded); late joiners are turned away."""
    return _dump({"ok": ok})


def closed_ok(value: bytes) -> bool:
    return bool(_load(value).get("ok"))


@dataclass(frozen=True)
class Status:
    """The ``status`` key: who has joined so far, for waiting nodes' "3/4 nodes joined" lines."""

    joined: int = 0
    names: tuple[str, ...] = ()  # the first few, in join order
    static_ranks: tuple[int, ...] = ()  # static mode: the node ranks seen

    def value(self) -> bytes:
        return _dump({"joined": self.joined, "names": list(self.names), "static_ranks": list(self.static_ranks)})

    @classmethod
    def parse(cls, value: bytes) -> Status:
        d = _load(value)
        return cls(int(d.get("joined", 0)), tuple(str(n) for n in d.get("names", ())),
                   tuple(int(r) for r in d.get("static_ranks", ())))


def _phase(value: object) -> Phase:
    try:
        return Phase(value)
    except ValueError:
        return Phase.FORMING  # no word yet, or one this version does not know: not running, not ended
