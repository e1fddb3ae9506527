"""``--checkpoint-dir``'s writer (``rankrun.checkpoint.disk``) on real files: snapshots in memfds as the keeper hands
them, written through the loop's executor into a temporary folder. A newer step abandons an older one being written, a
flush never does and stops at its deadline, two complete steps are kept, and no tmp file or fd is left behind."""

from __future__ import annotations

import asyncio
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from rankrun.checkpoint import disk
from rankrun.checkpoint.disk import DiskWriter, Snapshot, amount, cut_line
from rankrun.checkpoint.manifest import (
    DiskStep,
    NodeManifest,
    decode,
    encode,
    manifest_name,
    newest_complete,
    rank_name,
    step_name,
)

BOUND = 30.0  # every wait's bound; the writes here take milliseconds
CHUNK = 64 << 10  # the chunk the tests write in: a throttled write has many


@pytest.fixture(autouse=True)
def _small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(disk, "CHUNK", CHUNK)


class Memfds:
    """Snapshots as the keeper makes them (a memfd filled once), and which of them this process still holds."""

    def __init__(self) -> None:
        self.tag = f"rankrun-test-{os.urandom(4).hex()}"

    def snapshot(self, data: bytes, *, length: int | None = None) -> Snapshot:
        fd = os.memfd_create(self.tag, os.MFD_CLOEXEC)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        return fd, len(data) if length is None else length

    def held(self) -> list[str]:
        found = []
        for name in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{name}")
            except OSError:
                continue
            if target.startswith(f"/memfd:{self.tag} "):
                found.append(name)
        return found


class Seen:
    """What the writer said and reported, and a wait for a report."""

    def __init__(self) -> None:
        self.said: list[str] = []
        self.written: list[tuple[int, str, int, str]] = []  # (step, path, bytes, state): seconds are not compared
        self.news = asyncio.Event()

    def on_written(self, step: int, path: str, size: int, seconds: float, state: str) -> None:
        assert 0 <= seconds < BOUND
        self.written.append((step, path, size, state))
        self.news.set()

    async def until(self, check: Callable[[], bool]) -> None:
        async with asyncio.timeout(BOUND):
            while not check():
                self.news.clear()
                await self.news.wait()


async def _until_writing(writer: DiskWriter, step: int) -> None:
    """Until ``step``'s write has sent its first chunk (the writer's progress, looked at every few ms, bounded)."""
    async with asyncio.timeout(BOUND):
        while (now := writer.writing) is None or now[0] != step or now[1] == 0:
            await asyncio.sleep(0.005)


def _tree(folder: Path) -> dict[str, list[str]]:
    return {str(p.relative_to(folder)): sorted(os.listdir(p)) for p in sorted([folder, *folder.rglob("*")]) if p.is_dir()}


def _tmp_files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.name.endswith(".tmp")]


def test_an_offered_step_is_on_disk_whole_with_its_manifest_and_nothing_else(tmp_path):
    fds, seen = Memfds(), Seen()
    folder = tmp_path / "run"
    data = {0: os.urandom(5 * CHUNK + 123), 1: os.urandom(100), 2: b""}  # several chunks, one, none
    longer = os.urandom(3 * CHUNK + 10)  # a snapshot's fd may hold more than its length (a slot sized for more)

    async def scenario() -> bool:
        writer = DiskWriter(folder, "node/a", say=seen.said.append, on_written=seen.on_written)
        snapshots = {rank: fds.snapshot(b) for rank, b in data.items()}
        writer.offer(7, 4, {**snapshots, 3: fds.snapshot(longer, length=2 * CHUNK + 5)})
        await seen.until(lambda: len(seen.written) == 1)
        done = await writer.flush(asyncio.get_running_loop().time() + BOUND)
        await writer.close()
        return done

    assert asyncio.run(scenario())
    step = folder / step_name(7)
    data[3] = longer[:2 * CHUNK + 5]
    total = sum(map(len, data.values()))
    assert seen.written == [(7, str(step), total, "complete")]
    assert seen.said == []
    assert _tree(folder) == {".": [step_name(7)],
                             step_name(7): ["node_node_a.json", "rank_0.pt", "rank_1.pt", "rank_2.pt", "rank_3.pt"]}
    umask = os.umask(0o022)
    os.umask(umask)
    for rank, b in data.items():
        assert (step / rank_name(rank)).read_bytes() == b  # exactly the snapshot's bytes: a plain torch.load reads them
        assert stat.S_IMODE((step / rank_name(rank)).stat().st_mode) == 0o644 & ~umask
    record = decode((step / manifest_name("node/a")).read_bytes())
    assert record is not None
    assert (record.step, record.world, record.ranks, record.bytes) == (7, 4, (0, 1, 2, 3), total)
    assert newest_complete(folder) == DiskStep(7, 4, {r: step / rank_name(r) for r in range(4)})
    assert fds.held() == []  # the writer closed every fd it was handed


def test_a_newer_offer_abandons_the_step_being_written_and_the_newer_one_is_written(tmp_path):
    fds, seen = Memfds(), Seen()
    folder = tmp_path / "run"

    async def scenario() -> None:
        writer = DiskWriter(folder, "a", say=seen.said.append, on_written=seen.on_written, chunk_delay=0.2)
        writer.offer(1, 2, {0: fds.snapshot(os.urandom(64 * CHUNK)), 1: fds.snapshot(b"one")})  # 13 s at least
        await _until_writing(writer, 1)
        writer.offer(2, 2, {0: fds.snapshot(b"two-0"), 1: fds.snapshot(b"two-1")})  # one chunk a file: 0.4 s
        writer.offer(3, 2, {0: fds.snapshot(b"three-0"), 1: fds.snapshot(b"three-1")})  # 2 was not begun: dropped
        await seen.until(lambda: len(seen.written) == 2)
        await writer.close()

    asyncio.run(scenario())
    assert [(step, state) for step, _, _, state in seen.written] == [(1, "abandoned"), (3, "complete")]
    assert 0 < seen.written[0][2] < 64 * CHUNK  # it stopped part of the way
    assert seen.said == []
    assert _tree(folder) == {".": [step_name(3)], step_name(3): ["node_a.json", "rank_0.pt", "rank_1.pt"]}
    assert (folder / step_name(3) / "rank_1.pt").read_bytes() == b"three-1"
    assert fds.held() == []


def test_a_flush_finishes_the_step_being_written_and_then_the_newest_offered(tmp_path):
    fds, seen = Memfds(), Seen()
    folder = tmp_path / "run"

    async def scenario() -> bool:
        loop = asyncio.get_running_loop()
        writer = DiskWriter(folder, "a", say=seen.said.append, on_written=seen.on_written, chunk_delay=0.02)
        first = os.urandom(10 * CHUNK)
        writer.offer(1, 1, {0: fds.snapshot(first)})
        await _until_writing(writer, 1)
        flushing = asyncio.create_task(writer.flush(loop.time() + BOUND))
        await asyncio.sleep(0)  # the flush begins: from here on nothing is abandoned
        writer.offer(2, 1, {0: fds.snapshot(b"saved in the grace")})  # a worker's last save, after the signal
        done = await flushing
        await writer.close()
        assert (folder / step_name(1) / "rank_0.pt").read_bytes() == first
        return done

    assert asyncio.run(scenario())
    assert [(step, state) for step, _, _, state in seen.written] == [(1, "complete"), (2, "complete")]
    assert newest_complete(folder) == DiskStep(2, 1, {0: folder / step_name(2) / "rank_0.pt"})
    assert _tmp_files(folder) == []
    assert fds.held() == []


@pytest.mark.parametrize(("later", "before", "grace"), [(False, True, 30), (True, True, 30), (False, False, None)],
                         ids=["the step being written", "a step offered during the flush",
                              "nothing on disk before, the seconds left named"])
def test_a_flush_past_its_deadline_removes_the_tmp_files_keeps_the_step_before_and_says_so(tmp_path, later, before,
                                                                                          grace):
    fds, seen = Memfds(), Seen()
    folder = tmp_path / "run"
    size = 10 * CHUNK

    async def scenario() -> tuple[bool, float]:
        loop = asyncio.get_running_loop()
        if before:
            earlier = DiskWriter(folder, "a", say=seen.said.append, on_written=seen.on_written)
            earlier.offer(110, 2, {0: fds.snapshot(b"old-0"), 1: fds.snapshot(b"old-1")})
            await seen.until(lambda: len(seen.written) == 1)
            await earlier.close()
        writer = DiskWriter(folder, "a", say=seen.said.append, on_written=seen.on_written, chunk_delay=BOUND)
        writer.offer(120, 2, {0: fds.snapshot(os.urandom(size)), 1: fds.snapshot(os.urandom(size))})
        await _until_writing(writer, 120)
        started = loop.time()
        flushing = asyncio.create_task(writer.flush(started + 0.3, grace=grace))
        await asyncio.sleep(0)
        if later:
            writer.offer(130, 2, {0: fds.snapshot(os.urandom(size)), 1: fds.snapshot(b"")})
        done = await flushing
        took = loop.time() - started
        writer.offer(140, 2, {0: fds.snapshot(b"after"), 1: fds.snapshot(b"")})  # the launcher is leaving: closed
        await asyncio.sleep(0)
        assert writer.writing is None
        await writer.close()
        return done, took

    done, took = asyncio.run(scenario())
    assert not done
    assert took < BOUND / 2  # it stopped at the deadline, not at the end of the throttled chunk
    step, written, total = (130, 0, size) if later else (120, CHUNK, 2 * size)
    newest = "the newest step on disk is 110" if before else "there is no complete step on disk"
    assert seen.said == [f"checkpoint: step {step} was not written to {folder} within --shutdown-timeout "
                         f"{grace or 0.3} s ({amount(written, total)}); {newest}"]
    assert [(s, state) for s, _, _, state in seen.written] == [(110, "complete")] * before + [(120, "abandoned")]
    kept = {step_name(110): ["node_a.json", "rank_0.pt", "rank_1.pt"]} if before else {}
    assert _tree(folder) == {".": sorted(kept), **kept}
    assert newest_complete(folder) == (
        DiskStep(110, 2, {r: folder / step_name(110) / rank_name(r) for r in range(2)}) if before else None)
    assert fds.held() == []


def test_keep_two_removes_this_nodes_files_of_older_steps_and_their_folders_once_empty(tmp_path):
    fds, seen = Memfds(), Seen()
    folder = tmp_path / "run"
    torn = folder / step_name(0)  # a step a killed launcher never finished: its tmp file and a renamed file
    torn.mkdir(parents=True)
    (torn / ".rank_0.pt.dead.tmp").write_bytes(b"half")
    (torn / "rank_1.pt").write_bytes(b"whole, but no manifest")
    for rank in (2, 3):  # this node's ranks in a world it had before: its manifest names them
        (torn / rank_name(rank)).write_bytes(b"from another world")
    (torn / ".rank_3.pt.cd.tmp").write_bytes(b"half")
    (torn / manifest_name("a")).write_bytes(encode(NodeManifest(0, 4, (2, 3), 36, 1.0)))
    shared = folder / step_name(1)
    shared.mkdir()
    (shared / "rank_9.pt").write_bytes(b"another node's file")
    (shared / ".rank_9.pt.ab.tmp").write_bytes(b"another node's tmp file")

    async def scenario() -> list[dict[str, list[str]]]:
        writer = DiskWriter(folder, "a", say=seen.said.append, on_written=seen.on_written)
        trees = []
        for step in (1, 2, 3, 4):
            writer.offer(step, 2, {0: fds.snapshot(b"%d-0" % step), 1: fds.snapshot(b"%d-1" % step)})
            await seen.until(lambda n=step: len(seen.written) == n)
            trees.append(_tree(folder))
        await writer.close()
        return trees

    trees = asyncio.run(scenario())
    files = ["node_a.json", "rank_0.pt", "rank_1.pt"]
    assert trees[0] == {".": [step_name(s) for s in (0, 1)],
                        step_name(0): [".rank_0.pt.dead.tmp", ".rank_3.pt.cd.tmp", "node_a.json", "rank_1.pt",
                                       "rank_2.pt", "rank_3.pt"],
                        step_name(1): [".rank_9.pt.ab.tmp", *files, "rank_9.pt"]}  # one complete step: nothing goes
    # two complete: the torn step older than both goes (no writer goes back to it), the complete ones stay
    assert trees[1] == {".": [step_name(s) for s in (1, 2)], step_name(1): [".rank_9.pt.ab.tmp", *files, "rank_9.pt"],
                        step_name(2): files}
    assert trees[2] == {".": [step_name(s) for s in (1, 2, 3)], step_name(1): [".rank_9.pt.ab.tmp", "rank_9.pt"],
                        step_name(2): files, step_name(3): files}
    assert trees[3] == {".": [step_name(s) for s in (1, 3, 4)], step_name(1): [".rank_9.pt.ab.tmp", "rank_9.pt"],
                        step_name(3): files, step_name(4): files}
    assert (folder / step_name(4) / "rank_1.pt").read_bytes() == b"4-1"
    assert seen.said == []


def test_two_nodes_sharing_the_dir_make_each_step_complete_together_and_keep_two_together(tmp_path):
    fds, seen = Memfds(), Seen()
    folder = tmp_path / "run"

    async def scenario() -> list[int | None]:
        nodes = {"a": (0, 1), "b": (2, 3)}
        writers = {n: DiskWriter(folder, n, say=seen.said.append, on_written=seen.on_written) for n in nodes}
        newest = []
        for step in (1, 2, 3):
            writers["a"].offer(step, 4, {r: fds.snapshot(b"%d:%d" % (step, r)) for r in nodes["a"]})
            await seen.until(lambda n=step: len(seen.written) == 2 * n - 1)
            found = newest_complete(folder)
            newest.append(None if found is None else found.step)  # node b's ranks of this step are not there yet
            writers["b"].offer(step, 4, {r: fds.snapshot(b"%d:%d" % (step, r)) for r in nodes["b"]})
            await seen.until(lambda n=step: len(seen.written) == 2 * n)
            found = newest_complete(folder)
            newest.append(None if found is None else found.step)
        # node a wrote step 3 before it was complete: its files of step 1 wait for its next step, or its close
        assert _tree(folder)[step_name(1)] == ["node_a.json", "rank_0.pt", "rank_1.pt"]
        for writer in writers.values():
            await writer.close()
        return newest

    assert asyncio.run(scenario()) == [None, 1, 1, 2, 2, 3]
    files = ["node_a.json", "node_b.json", "rank_0.pt", "rank_1.pt", "rank_2.pt", "rank_3.pt"]
    assert _tree(folder) == {".": [step_name(2), step_name(3)], step_name(2): files, step_name(3): files}
    assert (folder / step_name(3) / "rank_2.pt").read_bytes() == b"3:2"
    assert fds.held() == []


def test_a_write_that_fails_is_one_line_and_the_next_step_is_written(tmp_path):
    fds, seen = Memfds(), Seen()
    folder = tmp_path / "run"

    async def scenario() -> tuple[bool, bool]:
        loop = asyncio.get_running_loop()
        writer = DiskWriter(folder, "a", say=seen.said.append, on_written=seen.on_written)
        writer.offer(5, 2, {0: fds.snapshot(b"whole"), 1: fds.snapshot(b"short", length=9)})  # says more than it has
        await seen.until(lambda: len(seen.written) == 1)
        failed = await writer.flush(loop.time() + BOUND)
        writer.offer(6, 2, {0: fds.snapshot(b"six-0"), 1: fds.snapshot(b"six-1")})
        await seen.until(lambda: len(seen.written) == 2)
        done = await writer.flush(loop.time() + BOUND)
        await writer.close()
        return failed, done

    assert asyncio.run(scenario()) == (False, True)
    assert seen.said == [f"checkpoint: step 5 was not written to {folder}: the kept copy ends at byte 5 of 9"]
    assert [(s, state) for s, _, _, state in seen.written] == [(5, "abandoned"), (6, "complete")]
    assert _tree(folder) == {".": [step_name(6)], step_name(6): ["node_a.json", "rank_0.pt", "rank_1.pt"]}
    assert fds.held() == []


def test_a_step_written_again_is_never_complete_with_a_mix_of_old_and_new_files(tmp_path):
    fds, seen = Memfds(), Seen()
    folder = tmp_path / "run"
    (step := folder / step_name(3)).mkdir(parents=True)
    (step / "rank_0.pt").write_bytes(b"old")
    (step / manifest_name("a")).write_bytes(encode(NodeManifest(3, 1, (0,), 3, 1.0)))

    async def scenario() -> None:
        writer = DiskWriter(folder, "a", say=seen.said.append, on_written=seen.on_written, chunk_delay=BOUND)
        writer.offer(3, 1, {0: fds.snapshot(os.urandom(4 * CHUNK))})
        await _until_writing(writer, 3)
        assert newest_complete(folder) is None  # the old manifest went first
        names = sorted(os.listdir(step))
        assert len(names) == 2
        assert re.fullmatch(r"\.rank_0\.pt\.[0-9a-f]{8}\.tmp", names[0])  # hidden, never a name a reader takes
        assert names[1] == "rank_0.pt"
        assert (step / "rank_0.pt").read_bytes() == b"old"
        assert "rankrun-checkpoint-disk" in {task.get_name() for task in asyncio.all_tasks()}
        await writer.close()

    asyncio.run(scenario())
    assert seen.written[0][3] == "abandoned"
    assert _tmp_files(folder) == []
    assert fds.held() == []


def test_close_abandons_the_write_and_every_later_offer_is_closed_unwritten(tmp_path):
    fds, seen = Memfds(), Seen()
    folder = tmp_path / "run"

    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        await DiskWriter(folder, "idle", say=seen.said.append).close()  # nothing offered: nothing to do
        writer = DiskWriter(folder, "a", say=seen.said.append, on_written=seen.on_written, chunk_delay=BOUND)
        writer.offer(1, 1, {0: fds.snapshot(os.urandom(4 * CHUNK))})
        await _until_writing(writer, 1)
        flushing = asyncio.create_task(writer.flush(loop.time() + BOUND))
        await asyncio.sleep(0)
        writer.offer(2, 1, {0: fds.snapshot(b"pending")})  # during the flush: waits for step 1, abandons nothing
        started = loop.time()
        await writer.close()
        took = loop.time() - started
        assert not await flushing  # closed before it was on disk
        writer.offer(3, 1, {0: fds.snapshot(b"too late")})
        assert writer.writing is None
        assert not await writer.flush(loop.time() + BOUND)  # what was offered is not on disk
        return took

    assert asyncio.run(scenario()) < BOUND / 2
    assert [(s, state) for s, _, _, state in seen.written] == [(1, "abandoned")]
    assert _tree(folder) == {".": []}
    assert fds.held() == []


@pytest.mark.parametrize(("part", "whole", "text"), [
    (3_100_000_000, 4_200_000_000, "3.1 of 4.2 GB"),
    (0, 1_000_000_000, "0.0 of 1.0 GB"),
    (65536, 655360, "0.1 of 0.7 MB"),
    (0, 0, "0.0 of 0.0 MB"),
    (2_250_001, 2_250_001, "2.3 of 2.3 MB"),  # the units exactly: 2.250001 rounds up, a hair less would not
    (2_250_000_001, 2_250_000_001, "2.3 of 2.3 GB"),
    (999_000_000, 999_999_999, "999.0 of 1000.0 MB"),
])
def test_amount(part, whole, text):
    assert amount(part, whole) == text


def test_cut_line():
    assert cut_line(120, Path("/ck/job"), 30.0, written=3_100_000_000, total=4_200_000_000, on_disk=110) == (
        "checkpoint: step 120 was not written to /ck/job within --shutdown-timeout 30 s (3.1 of 4.2 GB); "
        "the newest step on disk is 110")
    assert cut_line(5, Path("/ck"), 1.5, written=0, total=10, on_disk=None) == (
        "checkpoint: step 5 was not written to /ck within --shutdown-timeout 1.5 s (0.0 of 0.0 MB); "
        "there is no complete step on disk")


def test_a_step_that_cannot_be_named_is_one_line_and_its_fds_are_closed(tmp_path):
    fds, seen = Memfds(), Seen()

    async def scenario() -> bool:
        writer = DiskWriter(tmp_path, "a", say=seen.said.append, on_written=seen.on_written)
        writer.offer(-1, 1, {0: fds.snapshot(b"x")})
        await seen.until(lambda: len(seen.written) == 1)
        done = await writer.flush(asyncio.get_running_loop().time() + BOUND)
        await writer.close()
        return done

    assert not asyncio.run(scenario())
    assert seen.said == [f"checkpoint: step -1 was not written to {tmp_path}: a step is never negative: -1"]
    assert seen.written == [(-1, "", 0, "abandoned")]
    assert fds.held() == []
