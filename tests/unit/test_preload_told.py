"""``agent.preload``'s pure part: an attempt's ``warm`` event from how each of its workers started, and what ``told``
emits (the node's ``preload`` events not emitted yet, then the attempt's ``warm``)."""

from __future__ import annotations

from dataclasses import dataclass

from rankrun.agent.deps import AgentDeps
from rankrun.agent.env import WorkerIdentity
from rankrun.agent.preload import PreloadNews, told, warm
from rankrun.events.records import Preload, Warm
from rankrun.events.stream import EventStream


@dataclass
class _Handle:
    forked_in: float | None


@dataclass
class _Started:
    who: WorkerIdentity
    handle: _Handle


def _worker(rank: int, forked_in: float | None) -> _Started:
    return _Started(WorkerIdentity(rank, rank, 0, rank, 4, 4, 1, 4), _Handle(forked_in))


def test_all_forked():
    workers = [_worker(r, t) for r, t in [(0, 0.03), (1, 0.01), (2, 0.05), (3, 0.02)]]
    assert warm(2, workers) == Warm(2, "0-3", "", 0.02, 0.05)


def test_mixed_and_the_median_of_an_odd_count():
    workers = [_worker(0, 0.04), _worker(1, None), _worker(2, 0.01), _worker(3, 0.09)]
    assert warm(0, workers) == Warm(0, "0,2-3", "1", 0.04, 0.09)


def test_all_cold():
    assert warm(1, [_worker(0, None), _worker(1, None)]) == Warm(1, "", "0-1", None, None)


class _Collect:
    def __init__(self) -> None:
        self.records: list[object] = []

    def on_event(self, record: object) -> None:
        self.records.append(record)


def _deps(news: PreloadNews | None) -> tuple[AgentDeps, _Collect]:
    stream = EventStream("run", "node")
    seen = _Collect()
    stream.add(seen)
    deps = AgentDeps(spawner=None, console=None, host="h", events=stream)  # type: ignore[arg-type]
    deps.preload_news = news
    return deps, seen


def test_told_emits_the_unsaid_preload_events_once_then_each_attempts_warm():
    news = PreloadNews("torch")
    news.ready = Preload("torch", 2.5, "ready")
    news.unsaid.append(news.ready)
    deps, seen = _deps(news)
    first = told(deps, 0, [_worker(0, 0.01)])
    assert first is not None and first[1] == news.ready and first[0].forked == "0"
    news.unsaid.append(Preload("torch", 0.0, "ended", "the preloading process ended (signal SIGKILL)"))
    told(deps, 1, [_worker(0, None)])
    kinds = [(type(r).__name__, getattr(r, "state", None), getattr(r, "attempt", None)) for r in seen.records]
    assert kinds == [("Preload", "ready", None), ("Warm", None, 0), ("Preload", "ended", None), ("Warm", None, 1)]
    assert all(r.run == "run" and r.node == "node" for r in seen.records)  # stamped by the stream


def test_without_preload_nothing_is_told():
    deps, seen = _deps(None)
    assert told(deps, 0, [_worker(0, None)]) is None
    assert seen.records == []
