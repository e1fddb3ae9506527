"""``rankrun.checkpoint.dcp`` with real torch, gloo and DTensor: ``dcp.save`` into the kept memory, and a restart's
``dcp.load`` re-sharded by DCP's own planner.

Why re-sharding is tested within one job: kept memory lives as long as its launcher, and a node's world size is
fixed for a job, so one job's restart cannot come back with 3 ranks where 2 saved (a world that changes across nodes
reads the lost node's state from the neighbour's copy or the disk). What a world change asks of the reader is the
same, though: each new rank reads chunks of several old ranks' kept states by rank (``fetch{rank}``), cut by DCP's
offsets. So 2 ranks save a row-sharded DTensor, and the restarted ranks load it sharded by columns (each rank's
block spans both old ranks' slots) and, with ``no_dist=True``, as a world of one (whole tensors from both slots).

Each job's attempt 0 dies halfway through step 3's save: the coordinator (rank 0) writing its slot in ``finish``
after rank 1 has kept step 3, or rank 1 in ``write_data``. Either way step 3 is not kept by every rank, and the
restart loads step 2, intact.
"""

from __future__ import annotations

import json

import pytest

from conftest import clean_environ, payload, run_cli

pytestmark = pytest.mark.usefixtures("private_tmpdir")

pytest.importorskip("torch")


@pytest.mark.parametrize("kill_rank", ["0", "1"], ids=["coordinator-in-finish", "rank-in-write-data"])
def test_a_dcp_save_killed_midway_loads_the_previous_step_resharded(tmp_path, kill_rank):
    env = clean_environ() | {"OUT": str(tmp_path), "KILL_RANK": kill_rank, "KILL_AT": "3",
                             "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}  # DTensor's import, not TMPDIR
    done = run_cli("--nproc-per-node", "2", "--max-restarts", "1", "--preload", "torch", payload("keep_dcp.py"), env=env,
                   cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stderr
    assert "was killed by signal 9 (SIGKILL)" in done.stderr
    # the steps each rank's slots hold complete: with the coordinator killed in finish, rank 1 had kept step 3
    # (in write_data) and step 3 is still not loaded, as it has no metadata
    held = {"0": [2], "1": [2, 3]} if kill_rank == "0" else {"0": [1, 2], "1": [2]}
    for rank in ("0", "1"):
        loaded = json.loads((tmp_path / f"{rank}.json").read_text())
        assert loaded == {"held": held[rank], "step": 2, "plain_load_step": 2, "resharded": True, "whole": True}, rank
