"""The keeper in this process (``rankrun.checkpoint.keeper``), reached by the rank's client from a thread: what a rank
is handed, room reserved or refused (one line per size), the kept step told once every local rank kept it, the step an
attempt resumes from, and what ``fetch`` hands back: a copy that never changes."""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest

import rankrun.checkpoint
from rankrun.checkpoint import client, slots
from rankrun.checkpoint.keeper import Keeper, snapshot
from rankrun.checkpoint.plan import Holding, Plan, Source
from rankrun.checkpoint.slots import COMPLETE, Desc


@pytest.fixture(autouse=True)
def _fresh_client(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(client, "_client", None)
    yield
    if client._client is not None:
        client._client._sock.close()


def runs(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """An async test, run on its own event loop."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


async def _until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Until ``condition`` holds (bounded): the keeper's background work, seen from the loop it runs on."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.005)


class Seen:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.told: list[tuple[str, dict[str, Any]]] = []


async def _keeper(monkeypatch: pytest.MonkeyPatch, seen: Seen, nproc: int = 1, room: int = 1 << 30) -> Keeper:
    keeper = Keeper(nproc, say=seen.lines.append, told=lambda what, facts: seen.told.append((what, facts)),
                    room=lambda growth: None if growth <= room else f"{room} bytes of room")
    monkeypatch.setenv("RANKRUN_CHECKPOINT", await keeper.start())
    return keeper


def _save(kept: client.Client, step: int, data: bytes) -> None:
    """What ``serial.save`` does around ``torch.save``: the bytes into the chosen slot, the descriptors, the notice."""
    index, gen = slots.choose(kept.header)
    view = kept.mapped(index, len(data))
    slots.write(kept.header, index, Desc(gen, step, kept.world, kept.rank, 0, slots.WRITING))
    view[:len(data)] = data
    slots.write(kept.header, index, Desc(gen, step, kept.world, kept.rank, len(data), COMPLETE, 1, 0.5))
    kept.tell("kept", slot=index, gen=gen, step=step, bytes=len(data), seconds=0.5)


@runs
async def test_a_worker_is_handed_its_files_and_a_stranger_is_refused(monkeypatch):
    seen = Seen()
    keeper = await _keeper(monkeypatch, seen, nproc=2)
    try:
        keeper.attempt_starts(0, 2)
        keeper.workers({os.getpid() + 1: (0, 0)})  # this process is not among them
        with pytest.raises(client.KeptError, match=f"process {os.getpid()} is not one of this attempt's workers"):
            await asyncio.to_thread(client.connect)
        keeper.attempt_starts(1, 2)
        keeper.workers({os.getpid(): (1, 1)})
        kept = await asyncio.to_thread(client.connect)
        assert (kept.rank, kept.world, kept.info["local_rank"], kept.info["attempt"]) == (1, 2, 1, 1)
        assert [s.capacity for s in kept.slots] == [0, 0]
        assert slots.valid(kept.header)
    finally:
        await keeper.close()


@runs
async def test_a_hello_before_the_workers_are_known_waits_for_them(monkeypatch):
    keeper = await _keeper(monkeypatch, Seen())
    try:
        keeper.attempt_starts(0, 1)
        connecting = asyncio.ensure_future(asyncio.to_thread(client.connect))
        await asyncio.sleep(0.05)
        assert not connecting.done()
        keeper.workers({os.getpid(): (0, 0)})
        assert (await connecting).rank == 0
    finally:
        await keeper.close()


@runs
async def test_room_is_reserved_or_refused_with_one_line_per_size(monkeypatch):
    seen = Seen()
    keeper = await _keeper(monkeypatch, seen, room=1 << 20)
    try:
        keeper.attempt_starts(0, 1)
        keeper.workers({os.getpid(): (0, 0)})
        kept = await asyncio.to_thread(client.connect)
        view = await asyncio.to_thread(kept.mapped, 0, 1000)
        assert kept.slots[0].capacity == 1000 and len(view) == 1000
        assert os.fstat(kept.slots[0].fd).st_blocks * 512 >= 1000  # reserved, not only sized
        await asyncio.to_thread(_save, kept, 1, b"x" * 1000)
        await _until(lambda: keeper._files[0].capacity[1] == 1000)  # the other slot, reserved ahead of its save
        assert os.fstat(kept.slots[1].fd).st_blocks * 512 >= 1000
        for _ in range(2):
            with pytest.raises(client.NoRoom, match="1048576 bytes of room"):
                await asyncio.to_thread(kept.mapped, 1, 3 << 20)
        assert seen.lines == ["checkpoint: rank 0's state (3.0 MiB) is not kept: 1048576 bytes of room; step 1 stays kept"]
        assert [what for what, _ in seen.told].count("refused") == 2
        assert kept.slots[1].capacity == 0
    finally:
        await keeper.close()


@runs
async def test_a_step_is_told_kept_once_every_local_rank_kept_it(monkeypatch):
    seen = Seen()
    keeper = await _keeper(monkeypatch, seen, nproc=2)
    try:
        keeper.attempt_starts(0, 2)
        keeper.workers({os.getpid(): (0, 0), os.getpid() + 10**6: (1, 1)})
        kept = await asyncio.to_thread(client.connect)
        await asyncio.to_thread(_save, kept, 4, b"a" * 10)
        await asyncio.sleep(0.05)
        assert seen.told == []  # rank 1 has not kept step 4
        keeper._on_kept(1, 4, 20, 0.75)
        assert seen.told == [("kept", {"step": 4, "ranks": [0, 1], "bytes": 30, "seconds": 0.75})]
    finally:
        await keeper.close()


@runs
async def test_a_ranks_steps_read_before_anothers_older_one_leave_that_one_to_complete(monkeypatch):
    """Each rank's messages come in order on its own socket, the sockets in any order: under load rank 0's steps 4-6
    may all be read before rank 1's step 4 (rank 0 cannot pass step 6's all-reduce before rank 1 saved step 5). Every
    step is still told kept, once, in order; a step one rank skipped is dropped once every rank went past it."""
    seen = Seen()
    keeper = await _keeper(monkeypatch, seen, nproc=2)
    try:
        keeper.attempt_starts(0, 2)
        keeper.workers({os.getpid(): (0, 0), os.getpid() + 10**6: (1, 1)})
        for step in (4, 5, 6):
            keeper._on_kept(0, step, 10, 0.25)
        for step in (4, 5, 6):
            keeper._on_kept(1, step, 20, 0.5)
        assert [(what, facts["step"]) for what, facts in seen.told] == [("kept", 4), ("kept", 5), ("kept", 6)]
        keeper._on_kept(0, 8, 10, 0.25)  # rank 1 skipped step 8 (it saves 9 next): 8 never completes, and goes
        keeper._on_kept(1, 9, 20, 0.5)
        keeper._on_kept(0, 9, 10, 0.25)
        assert [facts["step"] for _, facts in seen.told] == [4, 5, 6, 9]
        assert keeper._kept == {}
    finally:
        await keeper.close()


@runs
async def test_an_attempt_resumes_from_the_step_every_rank_kept_and_gets_a_copy_that_never_changes(monkeypatch):
    seen = Seen()
    keeper = await _keeper(monkeypatch, seen)
    try:
        assert keeper.attempt_starts(0, 1) == ""  # nothing kept
        keeper.workers({os.getpid(): (0, 0)})
        kept = await asyncio.to_thread(client.connect)
        answer, fds = await asyncio.to_thread(kept.ask, "fetch", rank=None)
        assert (answer["kind"], fds) == ("none", [])
        for step in (1, 2):
            await asyncio.to_thread(_save, kept, step, bytes([step]) * 100)
        resume = keeper.attempt_starts(1, 1)
        assert isinstance(resume, Plan) and (resume.step, resume.world) == (2, 1)
        keeper.workers({os.getpid(): (0, 0)})
        answer, (fd,) = await asyncio.to_thread(kept.ask, "fetch", rank=None)
        assert {k: answer[k] for k in ("kind", "step", "world", "rank", "bytes", "source")} == {
            "kind": "state", "step": 2, "world": 1, "rank": 0, "bytes": 100, "source": "memory"}
        await asyncio.to_thread(_save, kept, 3, b"\3" * 100)
        await asyncio.to_thread(_save, kept, 4, b"\4" * 100)  # into the slot step 2 was in
        assert os.pread(fd, 200, 0) == b"\2" * 100  # the copy handed out did not change
        os.close(fd)
        kept.tell("loaded", step=2, bytes=100, seconds=0.25)
        await asyncio.sleep(0.05)
        keeper.attempt_ended()
        assert seen.told[-1] == ("restored", {"attempt": 1, "step": 2, "ranks": [0], "bytes": 100, "seconds": 0.25,
                                              "source": "memory"})
    finally:
        await keeper.close()


@runs
async def test_a_changed_world_names_the_old_rank_and_a_rank_outside_it_is_refused(monkeypatch):
    keeper = await _keeper(monkeypatch, Seen())
    try:
        keeper.attempt_starts(0, 1)
        keeper.workers({os.getpid(): (0, 0)})
        kept = await asyncio.to_thread(client.connect)
        await asyncio.to_thread(_save, kept, 1, b"z" * 10)
        keeper.attempt_starts(1, 3)  # the world grew from 1 to 3
        keeper.workers({os.getpid(): (0, 0)})
        answer, _ = await asyncio.to_thread(kept.ask, "fetch", rank=None)
        assert answer == {"v": 1, "kind": "refused",
                          "why": "the world changed from 1 to 3 ranks: load(rank=r) names which old rank's state"}
        answer, _ = await asyncio.to_thread(kept.ask, "fetch", rank=2)
        assert answer["why"] == "rank 2 is not one of the 1 ranks that saved step 1"
        answer, (fd,) = await asyncio.to_thread(kept.ask, "fetch", rank=0)
        assert answer["step"] == 1 and os.pread(fd, 20, 0) == b"z" * 10
        os.close(fd)
    finally:
        await keeper.close()


def test_a_snapshot_copies_exactly_the_length_asked():
    source = os.memfd_create("test-source")
    try:
        os.write(source, b"0123456789")
        copy = snapshot(source, 4)
        assert os.fstat(copy).st_size == 4 and os.pread(copy, 10, 0) == b"0123"
        os.close(copy)
        with pytest.raises(OSError, match="ended after 10 of 20 bytes"):
            snapshot(source, 20)
    finally:
        os.close(source)


@runs
async def test_an_attempt_with_kept_steps_but_none_common_says_so_once(monkeypatch):
    seen = Seen()
    keeper = await _keeper(monkeypatch, seen, nproc=2)
    try:
        keeper.attempt_starts(0, 2)
        keeper.workers({os.getpid(): (0, 0)})
        kept = await asyncio.to_thread(client.connect)
        await asyncio.to_thread(_save, kept, 1, b"x" * 10)  # rank 1 never kept anything
        for attempt in (1, 2):
            assert keeper.attempt_starts(attempt, 2) == "no step is kept by every rank: rank 0 kept step 1, rank 1 kept nothing"
        assert seen.lines == ["checkpoint: attempt 1 has no step to resume from (no step is kept by every rank: rank 0 "
                              "kept step 1, rank 1 kept nothing); without --checkpoint-dir holding one, its ranks start "
                              "from the beginning"]
    finally:
        await keeper.close()


class FakeCopy:
    def __init__(self, fd: int, world: int, length: int) -> None:
        self.fd, self.world, self.length = fd, world, length


class Held:
    """The copies a node holds for its neighbour (``peer.PeerServer``'s part the keeper reads), in memory files."""

    def __init__(self, copies: dict[str, dict[int, list[tuple[int, int, bytes]]]]) -> None:
        self.files: dict[tuple[int, int], FakeCopy] = {}
        self.copies = copies
        for ranks in copies.values():
            for rank, held in ranks.items():
                for step, world, data in held:
                    fd = os.memfd_create("test-held")
                    os.write(fd, data)
                    self.files[(rank, step)] = FakeCopy(fd, world, len(data))

    def steps(self) -> dict[str, dict[int, list[tuple[int, int]]]]:
        return {node: {rank: [(s, w) for s, w, _ in held] for rank, held in ranks.items()}
                for node, ranks in self.copies.items()}

    def find(self, rank: int, step: int) -> FakeCopy | None:
        return self.files.get((rank, step))

    def close(self) -> None:
        for copy in self.files.values():
            os.close(copy.fd)


@runs
async def test_what_a_node_holds_its_memory_its_neighbours_copies_and_the_disks_step(monkeypatch, tmp_path):
    rank_file = tmp_path / "rank_1.pt"
    rank_file.write_bytes(b"on disk")
    seen = Seen()
    keeper = Keeper(2, say=seen.lines.append, told=lambda what, facts: None, room=lambda growth: None,
                    disk=lambda: (3, 2, {0: tmp_path / "none", 1: rank_file}), node="n1")
    monkeypatch.setenv("RANKRUN_CHECKPOINT", await keeper.start())
    held = Held({"n0": {4: [(6, 8, b"four at 6"), (5, 8, b"four at 5")], 5: [(6, 8, b"five at 6")]}})
    keeper.neighbours = held
    try:
        keeper.attempt_starts(0, 2)
        keeper.workers({os.getpid(): (0, 0)})
        kept = await asyncio.to_thread(client.connect)
        await asyncio.to_thread(_save, kept, 7, b"own")
        peer = ("10.0.0.1", 9)
        assert keeper.holdings(peer) == [
            Holding("0", ((7, 2),), "memory", "n1", peer),
            Holding("4", ((6, 8), (5, 8)), "neighbour", "n1", peer), Holding("5", ((6, 8),), "neighbour", "n1", peer),
            Holding("0-1", ((3, 2),), "disk", "n1", None)]
        for (rank, step), (data, world) in {(0, 7): (b"own", 2), (4, 5): (b"four at 5", 8)}.items():
            found = await keeper.copy_of(rank, step)
            assert found is not None
            fd, got_world, length = found
            assert (os.pread(fd, 100, 0), got_world, length) == (data, world, len(data))
            os.close(fd)
        assert await keeper.copy_of(4, 7) is None
        # where an attempt's rank is read from: this node's copies (of the right world), the disk, another node
        asked: list[tuple[Source, int, int]] = []

        async def remote(source: Source, rank: int, step: int) -> int:
            asked.append((source, rank, step))
            fd = os.memfd_create("test-remote")
            os.write(fd, b"remote")
            return fd

        keeper.remote = remote
        for source, rank, step, world, data in (
                (Source("4", "neighbour", "n1"), 4, 6, 8, b"four at 6"), (Source("0-1", "disk", "n1"), 1, 3, 2, b"on disk"),
                (Source("2", "memory", "n2", ("10.0.0.2", 9)), 2, 6, 8, b"remote")):
            fd = await keeper._open(rank, step, world, source)
            assert os.pread(fd, 100, 0) == data
            os.close(fd)
        assert asked == [(Source("2", "memory", "n2", ("10.0.0.2", 9)), 2, 6)]
        for source, rank, step, world in ((Source("4", "neighbour", "n1"), 4, 6, 9), (Source("9", "memory", "n1"), 9, 6, 8)):
            with pytest.raises(OSError, match="not held on this node"):
                await keeper._open(rank, step, world, source)
    finally:
        held.close()
        await keeper.close()


@runs
async def test_each_taker_of_a_kept_step_gets_copies_of_its_own(monkeypatch):
    keeper = await _keeper(monkeypatch, Seen())
    got: list[tuple[str, int, int, dict[int, tuple[int, int]]]] = []
    done = asyncio.Event()

    def taker(name: str) -> Callable[[int, int, dict[int, tuple[int, int]]], None]:
        def take(step: int, world: int, copies: dict[int, tuple[int, int]]) -> None:
            got.append((name, step, world, copies))
            if len(got) == 2:
                done.set()
        return take

    keeper.on_step += [taker("disk"), taker("neighbour")]
    try:
        keeper.attempt_starts(0, 1)
        keeper.workers({os.getpid(): (0, 0)})
        kept = await asyncio.to_thread(client.connect)
        await asyncio.to_thread(_save, kept, 3, b"state of 3")
        async with asyncio.timeout(10):
            await done.wait()
        assert [(name, step, world, list(copies)) for name, step, world, copies in got] == [
            ("disk", 3, 1, [0]), ("neighbour", 3, 1, [0])]
        (fd_a, n_a), (fd_b, n_b) = got[0][3][0], got[1][3][0]
        assert fd_a != fd_b and n_a == n_b == 10
        for fd in (fd_a, fd_b):
            assert os.pread(fd, 100, 0) == b"state of 3"
            os.close(fd)
    finally:
        await keeper.close()


@runs
async def test_reserve_maps_both_slots_ahead_of_the_first_save(monkeypatch):
    seen = Seen()
    keeper = await _keeper(monkeypatch, seen, room=1 << 20)
    try:
        keeper.attempt_starts(0, 1)
        keeper.workers({os.getpid(): (0, 0)})
        assert await asyncio.to_thread(rankrun.checkpoint.reserve, 4096)
        kept = await asyncio.to_thread(client.connect)
        assert [s.capacity for s in kept.slots] == [4096, 4096] and all(s.view is not None for s in kept.slots)
        assert not await asyncio.to_thread(rankrun.checkpoint.reserve, 2 << 20)  # no room: said once, by the keeper
        assert len(seen.lines) == 1
        monkeypatch.delenv("RANKRUN_CHECKPOINT")
        assert not rankrun.checkpoint.reserve(4096)  # outside a rankrun job
    finally:
        await keeper.close()
