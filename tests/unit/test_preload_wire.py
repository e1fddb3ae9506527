"""The messages between the launcher and the preloading process (``rankrun.preload.wire``): what one side encodes the
other decodes, anything else is a ``ValueError``; which worker command lines can be forked, and their ``sys.path[0]``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rankrun.preload import wire

PY = "/opt/venv/bin/python3"


@pytest.mark.parametrize(("kind", "body"), [
    ("fork", {"id": 1, "argv": [PY, "-u", "train.py", "--lr=0.1"], "env": {"RANK": "0", "Ü": "ß\n"}, "cwd": "/w",
              "tty": False, "launcher": 4242, "cpus": [0, 2]}),
    ("ready", {"pid": 77, "seconds": 2.25}),
    ("unsafe", {"why": "it has 2 threads ('t'): a module started a thread at import", "seconds": 0.5}),
    ("error", {"module": "torch", "line": "ImportError: libcuda.so.1: cannot open shared object file"}),
    ("forked", {"id": 3, "pid": 12345}),
    ("refused", {"id": 3, "why": "fork() failed"}),
    ("eof", {}),
])
def test_a_message_decodes_to_what_was_encoded(kind, body):
    data = wire.encode(kind, body)
    assert wire.decode(data) == (kind, body)
    assert json.loads(data) == {"v": wire.VERSION, kind: body}  # JSON, never pickle: the launcher reads it


def test_a_message_is_compact_json_of_version_1():
    assert wire.VERSION == 1
    assert wire.encode("ready", {"pid": 7, "seconds": 1.5}) == b'{"v":1,"ready":{"pid":7,"seconds":1.5}}'


def test_a_large_environment_fits_one_message():
    env = {f"VAR_{i}": "x" * 100 for i in range(500)}  # ~55 KB, past any usual environment
    data = wire.encode("fork", {"env": env})
    assert len(data) < wire.LIMIT
    assert wire.decode(data) == ("fork", {"env": env})


def test_the_limits():
    assert wire.LIMIT == 4 << 20
    assert wire.FDS == 4  # stdin, stdout, stderr, go


@pytest.mark.parametrize(("data", "words"), [
    (b'{"v":2,"ready":{"pid":1}}', "not a preload message of version 1"),  # another version
    (b'{"ready":{"pid":1}}', "not a preload message of version 1"),  # no version
    (b'{"v":"1","ready":{"pid":1}}', "not a preload message of version 1"),  # the version as a string
    (b'{"v":1}', "not a preload message of version 1"),  # no kind
    (b'{"v":1,"ready":{},"forked":{}}', "not a preload message of version 1"),  # two kinds
    (b'[1,{"ready":{}}]', "not a preload message of version 1"),  # not an object
    (b'"ready"', "not a preload message of version 1"),
    (b'{"v":1,"ready":[1]}', "preload message 'ready' without a body"),
    (b'{"v":1,"ready":null}', "preload message 'ready' without a body"),
    (b'{"v":1,"ready":"x"}', "preload message 'ready' without a body"),
])
def test_anything_else_is_a_value_error(data, words):
    with pytest.raises(ValueError, match=f"^{words}$"):
        wire.decode(data)


@pytest.mark.parametrize("data", [b"", b"{", b"\xff\xfe", b"pickle\x80\x04"])
def test_bytes_that_are_not_json_are_a_value_error(data):
    # json's errors and a bad encoding's are ValueErrors: the reader's one ``except ValueError`` drops them all
    with pytest.raises(ValueError, match=r"^(Expecting|'utf-8' codec can't decode)"):
        wire.decode(data)


@pytest.mark.parametrize(("argv", "expected"), [
    ((PY, "-u", "train.py"), True),  # a script
    ((PY, "-u", "train.py", "--lr", "0.1", "-m", "x"), True),  # its arguments may be anything
    ((PY, "-u", "/abs/dir/train.py"), True),
    ((PY, "-u", "-m", "trainer"), True),  # a module
    ((PY, "-u", "-m", "pkg.trainer", "--epochs=3"), True),
    ((PY, "-u", "-m", "rankrun.run_path", "train.py", "a"), True),  # --run-path
    ((PY, "-u", "-m", "rankrun.api.worker", "/tmp/rr/payload", "/tmp/rr/results"), True),  # rankrun.launch(fn)'s
    (("/usr/bin/python3", "-u", "train.py"), False),  # another interpreter than the process's
    ((PY + "3", "-u", "train.py"), False),
    ((PY, "train.py"), False),  # not unbuffered: not a command line worker_argv writes
    ((PY, "-u"), False),  # too short
    ((PY,), False),
    ((), False),
    ((PY, "-u", "-m"), False),  # -m without a module
    ((PY, "-u", "-m", ""), False),
    ((PY, "-u", "-m", "-X"), False),  # a flag where the module goes
    ((PY, "-u", "-X", "importtime", "train.py"), False),  # an interpreter flag: a cold start's business
    ((PY, "-u", "-c", "print(1)"), False),
    ((PY, "-u", "-", "train.py"), False),  # stdin
    ((PY, "-u", "-B", "train.py"), False),
    (("-u", PY, "train.py"), False),
    (("train.sh", "-u", "train.py"), False),  # --no-python's program
])
def test_forkable(argv, expected):
    assert wire.forkable(argv, PY) is expected


def test_forkable_takes_any_sequence():
    assert wire.forkable([PY, "-u", "train.py"], PY)
    assert not wire.forkable([PY, "-u", "train.py"], "")


@pytest.mark.parametrize(("argv", "cwd", "expected"), [
    ((PY, "-u", "-m", "trainer"), "/work/job", "/work/job"),  # -m: the working directory
    ((PY, "-u", "-m", "rankrun.run_path", "sub/train.py"), "/work/job", "/work/job"),  # run_path is -m too
    ((PY, "-u", "/abs/dir/train.py"), "/work/job", "/abs/dir"),  # a script: its folder
    ((PY, "-u", "train.py"), "/work/job", "/work/job"),
    ((PY, "-u", "sub/deeper/train.py", "x"), "/work/job", "/work/job/sub/deeper"),
    ((PY, "-u", "../other/train.py"), "/work/job", "/work/other"),
])
def test_path0_is_the_cold_interpreters(argv, cwd, expected):
    assert wire.path0(argv, cwd) == expected


def test_path0_resolves_the_scripts_link_as_cpython_does(tmp_path):
    tmp_path = Path(os.path.realpath(tmp_path))  # no link above it: the links are the test's own
    real = tmp_path / "real"
    real.mkdir()
    (real / "train.py").write_text("")
    (tmp_path / "link.py").symlink_to(real / "train.py")
    (tmp_path / "linked").symlink_to(real)
    assert wire.path0((PY, "-u", "link.py"), str(tmp_path)) == str(real)
    assert wire.path0((PY, "-u", "linked/train.py"), str(tmp_path)) == str(real)
    assert wire.path0((PY, "-u", str(tmp_path / "link.py")), "/elsewhere") == str(real)
    assert wire.path0((PY, "-u", "-m", "m"), str(tmp_path / "linked")) == str(tmp_path / "linked")  # cwd as given
