"""What torchrun tolerates, rankrun tolerates: quotes a caller without a shell leaves, unknown ``--rdzv-conf`` keys
(warned about, since a typo should be seen), and ``--logs-specs default``."""

from __future__ import annotations

import pytest

from conftest import run_cli

pytestmark = pytest.mark.usefixtures("private_tmpdir")


def test_a_quoted_rdzv_conf_with_an_unknown_key_runs_and_warns(tmp_path):
    (tmp_path / "w.py").write_text("import os; print('ran', os.environ['RANK'])\n")
    # as a Kubernetes manifest or a subprocess list passes it: the quotes are part of the argument
    done = run_cli("--standalone", "--nproc-per-node", "2", "--rdzv-conf", "'join_timeout=5,last_call_timeout=\"1\",jion=3'",
                   "w.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert sorted(line.split(":", 1)[1] for line in done.stdout.splitlines()) == ["ran 0", "ran 1"]
    assert done.stderr.splitlines()[0].startswith("rankrun: warning: --rdzv-conf: unknown key 'jion' ignored (accepted: ")


def test_torchruns_default_logs_specs_is_the_layout_rankrun_writes(tmp_path):
    (tmp_path / "w.py").write_text("print('ran')\n")
    done = run_cli("--logs-specs", "default", "--log-dir", str(tmp_path / "logs"), "w.py", cwd=tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (0, "ran\n", "")
    assert len(list((tmp_path / "logs").glob("*/attempt_0/0"))) == 1  # torchrun's layout
