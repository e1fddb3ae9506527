"""``--checkpoint-dir``'s layout (``rankrun.checkpoint.manifest``): the names, the manifest codec, the rule that makes
a step complete and the keep-two decision (tables), and the readers on real folders full of junk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rankrun.checkpoint.manifest import (
    DiskStep,
    NodeManifest,
    complete_steps,
    complete_world,
    decode,
    encode,
    is_manifest_name,
    is_tmp_of,
    manifest_name,
    newest_complete,
    parse_rank_name,
    parse_step_name,
    rank_name,
    read_step,
    run_folder,
    stale,
    step_folders,
    step_name,
    tmp_name,
)


@pytest.mark.parametrize(("run_id", "folder"), [
    ("none", "/ck"),  # a static job that names no id: DIR itself
    ("job-7", "/ck/job-7"),
    ("f81d4fae-7dec-11d0-a765-00a0c91e6bf6", "/ck/f81d4fae-7dec-11d0-a765-00a0c91e6bf6"),
    ("a/../b", "/ck/a_.._b"),  # never a path
    ("..", "/ck/_.."),
    (".hidden", "/ck/_.hidden"),
    ("", "/ck/_"),
    ("two words", "/ck/two_words"),
    ("None", "/ck/None"),  # only torchrun's default itself
])
def test_run_folder(run_id, folder):
    assert run_folder(Path("/ck"), run_id) == Path(folder)


@pytest.mark.parametrize(("name", "step"), [
    ("step_000000120", 120), ("step_0", 0), ("step_120", 120), ("step_1234567890123", 1234567890123),
    ("step_", None), ("step_-1", None), ("step_12a", None), ("xstep_1", None), ("step_1.tmp", None), ("step_١٢", None),
    (".step_000000001.abc.tmp", None),
])
def test_step_names_parse_at_any_width_and_nothing_else(name, step):
    assert parse_step_name(name) == step


def test_step_names_are_zero_padded_so_a_listing_sorts():
    assert step_name(120) == "step_000000120"
    assert step_name(0) == "step_000000000"
    assert step_name(10**10) == "step_10000000000"
    assert sorted(step_name(s) for s in (100, 9, 20)) == [step_name(9), step_name(20), step_name(100)]
    for step in (0, 7, 120, 10**10):
        assert parse_step_name(step_name(step)) == step
    with pytest.raises(ValueError, match="never negative: -1"):
        step_name(-1)


@pytest.mark.parametrize(("name", "rank"), [
    ("rank_0.pt", 0), ("rank_15.pt", 15), ("rank_.pt", None), ("rank_1.pt.tmp", None), (".rank_1.pt.ab12.tmp", None),
    ("rank_1.pth", None), ("rank_-1.pt", None), ("node_0.json", None), ("rank_٣.pt", None),
])
def test_rank_names(name, rank):
    assert parse_rank_name(name) == rank


def test_rank_and_node_and_tmp_names():
    assert rank_name(3) == "rank_3.pt"
    assert parse_rank_name(rank_name(12)) == 12
    with pytest.raises(ValueError, match="never negative: -2"):
        rank_name(-2)
    assert manifest_name("n0") == "node_n0.json"
    assert manifest_name("host/a b") == "node_host_a_b.json"
    assert manifest_name("") == "node__.json"
    assert is_manifest_name("node_n0.json")
    assert not is_manifest_name("node_.json")
    assert not is_manifest_name(".node_n0.json.ab.tmp")
    assert not is_manifest_name("node_n0.json.bak")
    assert tmp_name("rank_3.pt", "ab12") == ".rank_3.pt.ab12.tmp"
    assert is_tmp_of(".rank_3.pt.ab12.tmp", "rank_3.pt")
    assert not is_tmp_of(".rank_3.pt.ab12.tmp", "rank_31.pt")
    assert not is_tmp_of(".rank_31.pt.ab12.tmp", "rank_3.pt")
    assert not is_tmp_of("rank_3.pt", "rank_3.pt")
    assert not is_tmp_of(".rank_3.pt.ab12", "rank_3.pt")


def test_a_manifest_round_trips_and_reads_as_the_layout_says():
    manifest = NodeManifest(step=120, world=16, ranks=(0, 1, 2, 3, 4, 5, 6, 7), bytes=4_200_000_000, saved=1765000000.5)
    assert json.loads(encode(manifest)) == {"v": 1, "step": 120, "world": 16, "ranks": "0-7", "bytes": 4_200_000_000,
                                            "saved": 1765000000.5}
    assert decode(encode(manifest)) == manifest


GOOD = {"v": 1, "step": 5, "world": 4, "ranks": "2-3", "bytes": 10, "saved": 1}


@pytest.mark.parametrize(("change", "valid"), [
    ({}, True),
    ({"saved": 1.5}, True),
    ({"step": 0, "bytes": 0}, True),
    ({"ranks": "3,2"}, True),
    ({"v": 2}, False), ({"v": None}, False), ({"v": "1"}, False),
    ({"step": -1}, False), ({"step": "5"}, False), ({"step": True}, False), ({"step": 5.0}, False), ({"step": None}, False),
    ({"world": 0}, False), ({"world": -4}, False), ({"world": True}, False),
    ({"ranks": ""}, False), ({"ranks": "2-4"}, False), ({"ranks": "4"}, False), ({"ranks": "a"}, False),
    ({"ranks": [2, 3]}, False), ({"ranks": "3-2"}, False),
    ({"bytes": -1}, False), ({"bytes": "10"}, False), ({"bytes": False}, False),
    ({"saved": "now"}, False), ({"saved": None}, False), ({"saved": True}, False),
])
def test_decode_takes_only_a_whole_valid_manifest(change, valid):
    raw = {**GOOD, **change}
    found = decode(json.dumps({k: v for k, v in raw.items() if v is not None}).encode())
    assert (found is not None) == valid
    if valid:
        assert found is not None
        assert found.world == raw["world"]
        assert found.step == raw["step"]


@pytest.mark.parametrize("data", [b"", b"{", b'{"v": 1, "step": 5, "wor', b"[]", b"null", b"\xff\xfe", b"1",
                                  json.dumps({k: v for k, v in GOOD.items() if k != "world"}).encode(),
                                  json.dumps({k: v for k, v in GOOD.items() if k != "bytes"}).encode(),
                                  json.dumps({k: v for k, v in GOOD.items() if k != "ranks"}).encode(),
                                  json.dumps({k: v for k, v in GOOD.items() if k != "saved"}).encode()])
def test_a_torn_or_foreign_manifest_is_none(data):
    assert decode(data) is None


def _m(ranks, world=4, step=5):
    return NodeManifest(step, world, tuple(ranks), 0, 0.0)


@pytest.mark.parametrize(("manifests", "present", "world"), [
    ([_m([0, 1]), _m([2, 3])], [0, 1, 2, 3], 4),
    ([_m([0, 1, 2, 3])], [0, 1, 2, 3], 4),
    ([_m([0, 1]), _m([1, 2, 3])], [0, 1, 2, 3], 4),  # a rank named twice (it moved node): still covered
    ([_m([0], world=1)], [0], 1),
    ([_m([0, 1]), _m([2, 3])], [0, 1, 2, 3, 4], 4),  # a stray file of a rank beyond the world: not in the way
    ([_m([0, 1])], [0, 1, 2, 3], None),  # a node's manifest missing
    ([_m([0, 1]), _m([2, 3])], [0, 1, 3], None),  # a named rank's file missing
    ([], [0, 1, 2, 3], None),
    ([_m([0, 1]), _m([2, 3], world=5)], [0, 1, 2, 3], None),  # two worlds
    ([_m([0, 1]), _m([0, 1], world=2)], [0, 1], None),
    ([_m([0, 1]), _m([2, 3], step=6)], [0, 1, 2, 3], None),  # another step's manifest
])
def test_a_step_is_complete_when_its_manifests_cover_the_world_and_every_file_is_there(manifests, present, world):
    assert complete_world(5, manifests, present) == world


@pytest.mark.parametrize(("complete", "present", "keep", "removed"), [
    ([], [], 2, []),
    ([10], [10], 2, []),
    ([10, 20], [10, 20], 2, []),
    ([10, 20, 30], [10, 20, 30], 2, [10]),
    ([30, 10, 20, 40], [], 2, [10, 20]),
    ([10, 20, 30], [], 1, [10, 20]),
    ([10, 20, 30], [], 3, []),
    ([10, 20, 30], [5, 15, 25, 35], 2, [5, 10, 15]),  # never-completed steps older than the oldest kept: gone too
    ([10], [5, 15], 2, []),  # one complete step: an incomplete one may still be written, or be all there is
    ([10, 20], [5, 15, 25], 2, [5]),
    ([10, 20], [10, 20, 20], 2, []),
])
def test_stale_keeps_the_newest_complete_steps(complete, present, keep, removed):
    assert stale(complete, keep, present=present) == removed


def test_stale_keeps_two_by_default_and_at_least_one():
    assert stale([1, 2, 3]) == [1]
    with pytest.raises(ValueError, match="keep at least one step: 0"):
        stale([1, 2], 0)


# --------------------------------------------------------------------------- the readers, on real folders


def _step(folder: Path, step: int, world: int, nodes: dict[str, list[int]], *, files: list[int] | None = None) -> Path:
    path = folder / step_name(step)
    path.mkdir(parents=True)
    for rank in range(world) if files is None else files:
        (path / rank_name(rank)).write_bytes(f"{step}:{rank}".encode())
    for node, ranks in nodes.items():
        (path / manifest_name(node)).write_bytes(encode(NodeManifest(step, world, tuple(ranks), 8, 1.0)))
    return path


def test_newest_complete_is_the_newest_step_every_rank_of_which_is_there(tmp_path):
    _step(tmp_path, 10, 4, {"a": [0, 1], "b": [2, 3]})
    _step(tmp_path, 20, 4, {"a": [0, 1], "b": [2, 3]})
    _step(tmp_path, 30, 4, {"a": [0, 1]})  # node b's manifest missing
    _step(tmp_path, 40, 4, {"a": [0, 1], "b": [2, 3]}, files=[0, 1, 2])  # rank 3's file missing
    torn = _step(tmp_path, 50, 4, {"a": [0, 1]})
    (torn / manifest_name("b")).write_bytes(b'{"v": 1, "step": 50, "wor')  # torn JSON
    half = tmp_path / step_name(60)
    half.mkdir()  # a half dir: nothing in it yet
    (half / ".rank_0.pt.ab12.tmp").write_bytes(b"partial")
    (tmp_path / step_name(70)).write_bytes(b"a file, not a folder")
    (tmp_path / "step_junk").mkdir()
    (tmp_path / ".step_000000080.tmp").mkdir()
    wrong = _step(tmp_path, 90, 2, {})
    (wrong / manifest_name("a")).write_bytes(encode(NodeManifest(91, 2, (0, 1), 8, 1.0)))  # says another step

    found = newest_complete(tmp_path)
    assert found == DiskStep(20, 4, {r: tmp_path / step_name(20) / rank_name(r) for r in range(4)})
    assert [s.step for s in complete_steps(tmp_path)] == [20, 10]
    assert sorted(step_folders(tmp_path)) == [10, 20, 30, 40, 50, 60, 90]


def test_a_complete_step_ignores_tmp_files_and_other_junk_beside_it(tmp_path):
    path = _step(tmp_path, 7, 2, {"n0": [0, 1]})
    (path / ".rank_0.pt.ab12.tmp").write_bytes(b"half")
    (path / ".node_n1.json.cd34.tmp").write_bytes(b"{")
    (path / "notes.txt").write_text("x")
    (path / "rank_5.pt").write_bytes(b"a rank of another world")
    (path / "node_old.json").write_bytes(b"not json")  # unreadable: ignored, not in the way
    assert read_step(path, 7) == DiskStep(7, 2, {0: path / "rank_0.pt", 1: path / "rank_1.pt"})
    assert (path / "rank_0.pt").read_bytes() == b"7:0"


def test_nothing_there_is_none(tmp_path):
    assert newest_complete(tmp_path / "missing") is None
    assert complete_steps(tmp_path / "missing") == []
    assert newest_complete(tmp_path) is None
    assert read_step(tmp_path / "missing", 1) is None
    _step(tmp_path, 1, 2, {})  # files, no manifest
    assert newest_complete(tmp_path) is None
    (tmp_path / "file").write_text("")
    assert step_folders(tmp_path / "file") == {}
