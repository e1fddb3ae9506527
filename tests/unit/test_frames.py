"""``rankrun.report.frames``: a worker's traceback from the user's code on, for the ``--run-path`` shim and
``rankrun.launch``'s worker, on real tracebacks (runpy's frames; the hook Python calls on an uncaught exception)."""

from __future__ import annotations

import runpy
import traceback
from pathlib import Path
from types import TracebackType

from rankrun.report.frames import from_user_code, trimmed


def _raised(tmp_path: Path) -> BaseException:
    script = tmp_path / "script.py"
    script.write_text("def helper():\n    raise ValueError('bad lr')\n\n\nhelper()\n")
    try:
        runpy.run_path(str(script), run_name="__main__")
    except ValueError as exc:
        return exc
    raise AssertionError("the script did not raise")


def _from_runpy(exc: BaseException) -> TracebackType:
    tb = exc.__traceback__
    assert tb is not None and tb.tb_next is not None
    return tb.tb_next  # runpy's frames first, as under `python -m rankrun.run_path`: the test's own is the shim's


def _files(tb: TracebackType | None) -> list[str]:
    return [frame.filename for frame in traceback.extract_tb(tb)]


def test_runpys_frames_before_the_scripts_are_left_out(tmp_path):
    tb = _from_runpy(_raised(tmp_path))
    assert "runpy" in _files(tb)[0]
    assert _files(from_user_code(tb)) == [str(tmp_path / "script.py")] * 2


def test_the_hook_python_calls_gets_the_scripts_frames_on_the_exception_too(tmp_path):
    exc = _raised(tmp_path)
    seen: list[tuple[object, ...]] = []
    trimmed(lambda *args: seen.append(args))(ValueError, exc, _from_runpy(exc))
    [(kind, value, tb)] = seen
    assert kind is ValueError and value is exc
    assert value.__traceback__ is tb  # Python's own hook prints __traceback__, not its argument
    assert _files(tb) == [str(tmp_path / "script.py")] * 2
