"""``examples/keep_progress.py`` does what its docstring says: run as written, with ``KILL_AT=12``, rank 1 dies at
step 12 and the restart resumes from step 10 (the newest kept step), on every rank."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import clean_environ, run_cli

pytestmark = pytest.mark.usefixtures("private_tmpdir")

pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "keep_progress.py"


def test_the_example_resumes_from_the_newest_kept_step(tmp_path):
    env = clean_environ() | {"KILL_AT": "12", "STEPS": "12", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    # --preload torch: as a user would run it, and one import of torch instead of four
    done = run_cli("--nproc-per-node", "2", "--max-restarts", "1", "--preload", "torch", str(EXAMPLE), env=env, cwd=tmp_path,
                   timeout=180)
    assert done.returncode == 0, done.stderr
    assert "rank 1 (pid" in done.stderr and "was killed by signal 9 (SIGKILL)" in done.stderr
    for rank in (0, 1):
        assert f"rank {rank} (attempt 0): starting at step 1" in done.stdout
        assert f"rank {rank} (attempt 1): resumed from step 10" in done.stdout
        assert f"rank {rank}: done at step 12" in done.stdout
