"""``--preload``: workers forked from one import per node, restarts included; a module that cannot be imported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import clean_environ, run_cli

pytestmark = pytest.mark.usefixtures("private_tmpdir")

MARKED = """\
import os
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "imports"), "a") as f:
    f.write(f"{os.getpid()}\\n")
"""

SCRIPT = """\
import os, sys
import marked
with open(os.path.join(os.environ["TEST_PID_DIR"], f"w{os.getpid()}"), "w") as f:
    f.write(str(os.getpid()))
print("rank", os.environ["RANK"], "attempt", os.environ["TORCHELASTIC_RESTART_COUNT"], "pid", os.getpid(), flush=True)
open(os.path.join(os.environ["TEST_PID_DIR"], f"r{os.environ['RANK']}a{os.environ['TORCHELASTIC_RESTART_COUNT']}"),
     "w").close()
if os.environ["RANK"] == "1" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    import time
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(os.environ["TEST_PID_DIR"], "r0a0")) and time.monotonic() < deadline:
        time.sleep(0.01)  # rank 0 has imported and said its pid before this one fails (bounded)
    sys.exit(3)
"""


def _job(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "marked.py").write_text(MARKED)
    (tmp_path / "job.py").write_text(SCRIPT)
    env = clean_environ()
    env["TEST_PID_DIR"] = str(tmp_path)
    return env


def _events(path: Path, kind: str) -> list[dict[str, object]]:
    return [e for e in map(json.loads, path.read_text().splitlines()) if e["event"] == kind]


def test_a_restart_forks_from_the_one_import(tmp_path, reaper):
    reaper.watch_dir(tmp_path)
    env = _job(tmp_path)
    events = tmp_path / "events.jsonl"
    done = run_cli("--nproc-per-node", "2", "--max-restarts", "1", "--preload", "marked", "--events", str(events),
                   "job.py", env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    importers = (tmp_path / "imports").read_text().split()
    workers = {int(p.name[1:]) for p in tmp_path.glob("w*")}
    assert len(importers) == 1, importers  # the preloading process's one import, no worker's
    assert int(importers[0]) not in workers and len(workers) == 4
    warm = _events(events, "warm")
    assert [(w["attempt"], w["forked"], w["cold"]) for w in warm] == [(0, "0-1", ""), (1, "0-1", "")]
    preload = _events(events, "preload")
    assert [(p["modules"], p["state"]) for p in preload] == [("marked", "ready")]


def test_without_preload_every_worker_imports(tmp_path, reaper):
    reaper.watch_dir(tmp_path)
    env = _job(tmp_path)
    events = tmp_path / "events.jsonl"
    done = run_cli("--nproc-per-node", "2", "--max-restarts", "1", "--events", str(events), "job.py", env=env,
                   cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert len((tmp_path / "imports").read_text().split()) == 4
    assert _events(events, "warm") == [] and _events(events, "preload") == []


@pytest.mark.parametrize(("module", "source", "line"), [
    ("nosuchmodule_rr", None, "--preload 'nosuchmodule_rr': cannot be imported: ModuleNotFoundError: No module named "
                              "'nosuchmodule_rr'"),
    ("boom", "raise ValueError('boom at import')\n", "--preload 'boom': cannot be imported: ValueError: boom at import"),
])
def test_a_module_that_cannot_be_imported_is_one_line_and_exit_2(tmp_path, reaper, module, source, line):
    reaper.watch_dir(tmp_path)
    env = _job(tmp_path)
    if source is not None:
        (tmp_path / f"{module}.py").write_text(source)
    done = run_cli("--nproc-per-node", "2", "--preload", module, "job.py", env=env, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"rankrun: error: {line}"], done.stderr
    assert "Traceback" not in done.stderr
    assert not list(tmp_path.glob("w*"))  # no worker started
