"""What a worker is given to answer with its stacks, and which files an attempt leaves (pure, and a tmp folder)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rankrun.stacks.channel import DUMP_SIGNAL, RUNNING_SIGNAL, SHIM_DIR, channel_env, drop_if_unused, running_file

pytestmark = pytest.mark.unit


def test_the_worker_is_told_both_signals_and_both_files_and_its_pythonpath_is_kept() -> None:
    env = channel_env({"PYTHONPATH": "/mine", "X": "1"}, "/run/attempt_0/0/stacks.txt")
    assert env["PYTHONPATH"] == f"{SHIM_DIR}:/mine" and env["RANKRUN_USER_PYTHONPATH"] == "/mine" and env["X"] == "1"
    assert env["RANKRUN_STACKS_FILE"] == "/run/attempt_0/0/stacks.txt"
    assert env["RANKRUN_STACKS_SIGNAL"] == str(int(DUMP_SIGNAL))
    assert env["RANKRUN_STACKS_RUNNING"] == f"{int(RUNNING_SIGNAL)} /run/attempt_0/0/stacks.running.txt"
    assert RUNNING_SIGNAL != DUMP_SIGNAL
    bare = channel_env({}, "/s.txt")
    assert bare["PYTHONPATH"] == SHIM_DIR and "RANKRUN_USER_PYTHONPATH" not in bare  # unset stays unset


def test_the_python_handlers_file_sits_beside_the_dump_file() -> None:
    assert running_file(Path("/a/0/stacks.txt")) == Path("/a/0/stacks.running.txt")


def test_files_without_a_dump_go_at_the_attempts_end_and_dumps_stay(tmp_path: Path) -> None:
    header = "rankrun-stacks main=0x00007f0000000001 pid=7 up=1.000000\n"
    for name, text, running, kept in [("a", header, "", set()),
                                      ("b", header + "Stack (most recent call first):\n", "", {"stacks.txt"}),
                                      ("c", header, "Current thread 0x1 (most recent call first):\n",
                                       {"stacks.running.txt"})]:
        folder = tmp_path / name
        folder.mkdir()
        dump = folder / "stacks.txt"
        dump.write_text(text)
        running_file(dump).write_text(running)  # empty: its dumps all taken back
        drop_if_unused(dump)
        assert {p.name for p in folder.iterdir()} == kept, name
    drop_if_unused(tmp_path / "gone" / "stacks.txt")  # nothing there: nothing to do
