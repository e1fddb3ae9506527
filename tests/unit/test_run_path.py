"""The ``--run-path`` shim's traceback trimming (``rankrun.run_path``): the script's frames, never the shim's or
runpy's, on real tracebacks."""

from __future__ import annotations

import runpy
import traceback
from pathlib import Path
from types import TracebackType

from rankrun.run_path import SHIM_FILES, trimmed, user_frames


def _raised(tmp_path: Path) -> BaseException:
    script = tmp_path / "script.py"
    script.write_text("def helper():\n    raise ValueError('bad lr')\n\n\nhelper()\n")
    try:
        runpy.run_path(str(script), run_name="__main__")
    except ValueError as exc:
        return exc
    raise AssertionError("the script did not raise")


def _files(tb: TracebackType | None) -> list[str]:
    return [frame.filename for frame in traceback.extract_tb(tb)]


def test_the_frames_before_the_scripts_are_left_out(tmp_path):
    exc = _raised(tmp_path)
    here = _files(exc.__traceback__)
    assert "<frozen runpy>" in here or any(f.endswith("runpy.py") for f in here)
    script = str(tmp_path / "script.py")
    skip = SHIM_FILES | {str(Path(__file__).resolve())}  # this test's frame stands for the shim's
    assert _files(user_frames(exc.__traceback__, skip)) == [script, script]


def test_a_traceback_of_the_shims_frames_only_is_kept_whole(tmp_path):
    tb = _raised(tmp_path).__traceback__
    assert user_frames(tb, frozenset()) is tb  # nothing to skip: all of it
    assert user_frames(None) is None
    everything = frozenset(_files(tb))
    assert user_frames(tb, everything) is tb  # the script's own frames are the shim's here: keep it all


def test_the_hook_gets_the_scripts_frames_on_the_exception_too(tmp_path):
    exc = _raised(tmp_path)
    from_runpy = exc.__traceback__.tb_next  # runpy's frames first, as under `python -m rankrun.run_path`
    assert from_runpy is not None
    seen: list[tuple[object, ...]] = []
    trimmed(lambda *args: seen.append(args))(ValueError, exc, from_runpy)
    [(kind, value, tb)] = seen
    assert kind is ValueError and value is exc
    assert value.__traceback__ is tb  # Python's own hook prints __traceback__, not its argument
    assert _files(tb) == [str(tmp_path / "script.py")] * 2
