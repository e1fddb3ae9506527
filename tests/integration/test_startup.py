"""What a plain single-node launch loads: nothing of multi-node, etcd, the terminal relay, json or shutil.

The launch benchmark's breakdown (``BENCHMARKS.md``) counts on these staying out of the path to the first
worker; ``-X importtime`` lists every module the launcher imported, whenever it imported it.
"""

from __future__ import annotations

import re
import subprocess

from conftest import PY, clean_environ, run_cli

_NEVER = re.compile(r"^(rankrun\.(store|rendezvous|agent\.multinode|proc\.terminal)(\..*)?|json|shutil|ssl|tempfile)$")


def _imported(*args: str, env: dict[str, str] | None = None) -> list[str]:
    run = subprocess.run([PY, "-X", "importtime", "-m", "rankrun", *args], env=env or clean_environ(),
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    return [line.rsplit("|", 1)[1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")]


def test_a_single_node_launch_imports_nothing_it_does_not_use() -> None:
    modules = _imported("--nproc-per-node", "2", "--no-python", "true")
    assert "rankrun.agent.attempt" in modules and "asyncio" in modules  # the listing is what we think it is
    # ssl appears as a blocked import (asyncio tries it; rankrun keeps it out): count real loads only
    loaded = [m for m in modules if _NEVER.match(m) and m != "ssl"]
    assert loaded == []


def test_help_is_wrapped_at_the_width_in_COLUMNS() -> None:
    run = run_cli("--help", env=clean_environ() | {"COLUMNS": "60"})
    assert run.returncode == 0
    wrapped = [line for line in run.stdout.splitlines() if not line.startswith("  -")]  # argparse never wraps these
    assert 50 <= max(len(line) for line in wrapped) <= 60
    wide = run_cli("--help", env=clean_environ() | {"COLUMNS": "200"})
    assert max(len(line) for line in wide.stdout.splitlines()) > 60
