"""``rankrun.api.worker``: a worker's exception as its caller sees it: the type named as Python's tracebacks name it,
the traceback from the user's code on (pure: real tracebacks in, names and frames out)."""

from __future__ import annotations

import subprocess
import sys
import traceback
from collections.abc import Callable
from functools import partial
from types import TracebackType

import pytest

from rankrun.api.launch import _relay, command_line
from rankrun.api.worker import type_name
from rankrun.report.frames import from_user_code


class Outer:
    class Inner(Exception):
        pass


def test_type_name_is_bare_for_builtins_and_main_and_module_dot_qualname_otherwise():
    local = type("Local", (Exception,), {"__module__": "__main__"})
    assert [type_name(cls) for cls in (ValueError, KeyboardInterrupt, Outer.Inner, local)] == [
        "ValueError", "KeyboardInterrupt", f"{__name__}.Outer.Inner", "Local"]
    for cls in (ValueError, KeyboardInterrupt, Outer.Inner, local):  # what traceback prints, to the letter
        assert traceback.format_exception_only(cls, cls("x")) == [f"{type_name(cls)}: x\n"]


def _raise_from_user_code() -> object:
    raise ValueError("from the user's code")


def _caught(call: Callable[[], object], match: str) -> TracebackType:
    """The traceback of ``call``'s exception from ``call`` on (a partial: no frame of this file above it)."""
    with pytest.raises(ValueError, match=match) as caught:
        call()
    tb = caught.value.__traceback__
    assert tb is not None and tb.tb_next is not None
    return tb.tb_next  # from the call on: the test's own frame is the catcher's, as worker.main's is


def _frames(tb: TracebackType | None) -> list[str]:
    return [frame.name for frame in traceback.extract_tb(tb)]


def test_rankruns_frames_above_the_users_code_go_and_the_users_stay():
    # rankrun's _relay calls the sink it is given: a rankrun frame, then the user's
    tb = _caught(partial(_relay, [b"line\n"], _raise_from_user_code, []), "from the user's code")
    assert _frames(tb) == ["_relay", "_raise_from_user_code"]
    assert _frames(from_user_code(tb)) == ["_raise_from_user_code"]
    assert from_user_code(None) is None


def test_a_traceback_that_is_rankruns_own_from_top_to_bottom_stays_whole():
    tb = _caught(partial(command_line, 1, {"no_such_option": 1}), "unknown option")
    assert _frames(tb) == ["command_line"]
    assert from_user_code(tb) is tb


RUN_PATH = """
import runpy, sys, traceback
from rankrun.report.frames import from_user_code
try:
    runpy.run_path(sys.argv[1])
except ValueError as exc:
    tb = exc.__traceback__.tb_next  # from runpy's frames on
    print(traceback.extract_tb(tb)[0].filename)
    print([(f.filename, f.name) for f in traceback.extract_tb(from_user_code(tb))])
"""


@pytest.mark.parametrize("frozen", ["on", "off"])  # off: runpy from its source file, a debug build's default
def test_runpys_frames_go_too(tmp_path, frozen):
    script = tmp_path / "users_script.py"
    script.write_text("raise ValueError('at the top of the script')\n")
    done = subprocess.run([sys.executable, "-X", f"frozen_modules={frozen}", "-c", RUN_PATH, str(script)],
                          capture_output=True, text=True, timeout=60, check=True)
    first, kept = done.stdout.splitlines()
    assert (first == "<frozen runpy>") if frozen == "on" else first.endswith("/runpy.py"), first
    assert kept == repr([(str(script), "<module>")]), done.stdout
