"""A real ``--preload`` job as its observers see it: the ``preload`` and ``warm`` events the launcher writes are schema
1 events that ``from_json`` reads back, the metrics folded from them count forked starts, and ``python -m
rankrun.timeline`` draws the attempts as forked and the import once. Plain-Python workers: the launcher is the point."""

from __future__ import annotations

import html
import json
import subprocess
import sys

import jsonschema
import pytest

from conftest import clean_environ, run_cli
from rankrun.events import schema_path
from rankrun.events.metrics import Metrics
from rankrun.events.records import Preload, Warm, as_json, from_json

pytestmark = pytest.mark.usefixtures("private_tmpdir")

# rank 1 fails attempt 0; attempt 1 succeeds. Each worker writes its pid where the reaper looks.
SCRIPT = """\
import os, sys
import marked
with open(os.path.join(os.environ["TEST_PID_DIR"], f"w{os.getpid()}"), "w") as f:
    f.write(str(os.getpid()))
if os.environ["RANK"] == "1" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    sys.exit(3)
"""


def test_a_preload_jobs_events_are_read_counted_and_drawn(tmp_path, reaper):
    pids = reaper.watch_dir(tmp_path / "pids")
    (tmp_path / "marked.py").write_text("VALUE = 1\n")
    (tmp_path / "job.py").write_text(SCRIPT)
    events = tmp_path / "events.jsonl"
    env = {**clean_environ(), "TEST_PID_DIR": str(pids)}
    done = run_cli("--nproc-per-node", "2", "--max-restarts", "1", "--preload", "marked", "--events", str(events),
                   "job.py", env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr

    lines = [json.loads(line) for line in events.read_text().splitlines()]
    validator = jsonschema.Draft202012Validator(json.loads(schema_path().read_text()))
    for obj in lines:
        assert [e.message for e in validator.iter_errors(obj)] == [], obj
    records = [from_json(obj) for obj in lines]
    assert [as_json(r) for r in records] == lines
    [ready] = [r for r in records if isinstance(r, Preload)]
    assert (ready.modules, ready.state, ready.why) == ("marked", "ready", "")
    assert 0 < ready.seconds < 60
    warm = [r for r in records if isinstance(r, Warm)]
    assert [(w.attempt, w.forked, w.cold) for w in warm] == [(0, "0-1", ""), (1, "0-1", "")]
    assert all(w.fork_p50 is not None and w.fork_max is not None and 0 <= w.fork_p50 <= w.fork_max for w in warm)

    metrics = Metrics()
    for record in records:
        metrics.on_event(record)
    text = metrics.render().decode()
    run = records[0].run
    assert f'rankrun_worker_starts_total{{run="{run}",how="forked"}} 4\n' in text
    assert f'rankrun_worker_starts_total{{run="{run}",how="exec"}} 0\n' in text
    assert f'rankrun_preload_import_seconds{{run="{run}"}} {ready.seconds!r}\n' in text

    page = tmp_path / "job.html"
    drawn = subprocess.run([sys.executable, "-m", "rankrun.timeline", str(events), "-o", str(page)], env=env,
                           capture_output=True, text=True, timeout=60, check=False)
    assert (drawn.returncode, drawn.stderr) == (0, "")
    shown = html.unescape(page.read_text())
    for words in ("attempt 0 · ranks 0-1 · forked · failed", "attempt 1 · ranks 0-1 · forked · succeeded"):
        assert f"<title>{words}</title>" in shown, words
    assert shown.count("<title>import marked ") == 1
