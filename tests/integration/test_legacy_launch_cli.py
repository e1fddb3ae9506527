"""``python -m rankrun.launch`` where torch's legacy launcher is hostile: ``--use-env=True``, ``--no-python`` without
``--use-env``, a script whose parser refuses ``--local-rank=N``, and a deprecation that is one line, said once a worker
starts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import clean_environ

pytestmark = pytest.mark.usefixtures("private_tmpdir")

NOTE = ("rankrun: note: python -m rankrun.launch keeps torch.distributed.launch's contract: each worker gets --local-rank=N "
        "after the script (none with --use-env); new scripts read LOCAL_RANK and run under rankrun")


def _launch(tmp_path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rankrun.launch", *args], cwd=tmp_path, env=clean_environ(),
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize(("flag", "inserted"), [("--use-env=True", False), ("--use_env=1", False), ("--use-env=false", True),
                                                ("--use-env", False)])
def test_use_env_takes_the_values_torchs_own_docs_show(tmp_path, flag, inserted):
    (tmp_path / "w.py").write_text("import os, sys; print(os.environ['LOCAL_RANK'], sys.argv[1:])\n")
    done = _launch(tmp_path, "--nproc-per-node", "1", flag, "w.py", "x")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ("0 ['--local-rank=0', 'x']\n" if inserted else "0 ['x']\n")
    assert done.stderr == NOTE + "\n"  # the deprecation: one line, no FutureWarning


def test_bad_use_env_value_and_no_python_without_use_env_are_one_line_and_exit_2(tmp_path):
    """The deprecation note comes once a worker starts: bad input is its one line alone (every other bad input of
    ``python -m rankrun.launch`` is in ``test_bad_input.py``)."""
    (tmp_path / "w.py").write_text("")
    bad = _launch(tmp_path, "--use-env=maybe", "w.py")
    assert (bad.returncode, bad.stdout, bad.stderr) == (
        2, "", "rankrun: error: --use-env 'maybe': expected 1/0, true/false or yes/no (or the flag alone)\n")
    program = _launch(tmp_path, "--no-python", "true")
    assert (program.returncode, program.stdout) == (2, "")
    assert program.stderr == ("rankrun: error: --no-python 'true': needs --use-env with python -m rankrun.launch: a program "
                              "gets LOCAL_RANK in its environment, not --local-rank=N\n")


def test_a_script_whose_parser_refuses_local_rank_is_told_how_to_fix_it(tmp_path):
    (tmp_path / "w.py").write_text("import argparse\np = argparse.ArgumentParser()\np.add_argument('--local_rank', type=int)\n"
                                   "p.parse_args()\n")
    done = _launch(tmp_path, "--nproc-per-node", "1", "w.py")
    assert done.returncode == 1
    assert "unrecognized arguments: --local-rank=0" in done.stderr
    lines = done.stderr.splitlines()
    fix = next(i for i, line in enumerate(lines) if line.startswith("  how to fix : "))
    assert "os.environ['LOCAL_RANK']" in lines[fix + 1] and "--use-env" in lines[fix + 2]
    assert "add_argument('--local-rank', '--local_rank', type=int)" in lines[fix + 2]
