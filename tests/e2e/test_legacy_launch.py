"""``python -m rankrun.launch`` against torch 2.13's ``python -m torch.distributed.launch``, in the same run: the same
worker argv and identity environment for a script, ``-m``, ``--run-path`` and ``--no-python --use-env``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import clean_environ, payload

pytest.importorskip("torch")

LAUNCHERS = {"torch": "torch.distributed.launch", "rankrun": "rankrun.launch"}


def _run(launcher: str, tmp_path: Path, *args: str) -> list[dict[str, object]]:
    out, tmp = tmp_path / launcher, tmp_path / f"{launcher}-tmp"
    out.mkdir()
    tmp.mkdir()
    env = clean_environ() | {"TEST_OUT_DIR": str(out), "PYTHONPATH": str(tmp_path), "TMPDIR": str(tmp)}
    done = subprocess.run([sys.executable, "-m", LAUNCHERS[launcher], "--standalone", "--nproc-per-node", "2", *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, (launcher, done.stderr)
    if launcher == "rankrun":
        assert list(tmp.iterdir()) == []  # torch's leaves its torchelastic_* directory behind; rankrun nothing
    return [json.loads((out / f"{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.parametrize("entry", [
    pytest.param(("w.py", "--lr", "0.1", "data"), id="script"),
    pytest.param(("w.py",), id="script-no-args"),
    pytest.param(("-m", "legacy_worker", "--lr", "0.1"), id="module"),
    pytest.param(("--run-path", "w.py", "--lr", "0.1"), id="run-path"),
    pytest.param(("--use-env", "w.py", "--lr", "0.1"), id="use-env"),
    pytest.param(("--no-python", "--use-env", "./w.py", "--lr", "0.1"), id="no-python-use-env"),
])
def test_workers_get_what_torch_distributed_launch_gives_them(tmp_path, entry):
    script = tmp_path / "w.py"
    script.write_text(f"#!{sys.executable}\n" + Path(payload("legacy_worker.py")).read_text())
    script.chmod(0o755)
    shutil.copy(payload("legacy_worker.py"), tmp_path / "legacy_worker.py")
    theirs, ours = _run("torch", tmp_path, *entry), _run("rankrun", tmp_path, *entry)
    assert ours == theirs
    if "--use-env" not in entry:
        assert all(r["argv"][0] == f"--local-rank={i}" for i, r in enumerate(ours))  # between the script and its args
    else:
        assert not any(a.startswith("--local-rank") for r in ours for a in r["argv"])  # type: ignore[union-attr]
