"""scripts/test says each slow, quiet step before it starts (apt-get, pip, the suite). Run on a copy of it, in a
folder of stand-ins: apt-get, sudo, .venv's tools and scripts/test-pythons only say they were called, so that the
order of the script's lines and the calls is one stream, and nothing is installed or run."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
CALLED = '#!/bin/sh\necho "CALLED $(basename "$0") $*"\n'


def _stand_in(path: Path, text: str = CALLED) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


def _run(tmp_path: Path, *, have: tuple[str, ...]) -> list[str]:
    """scripts/test's stdout where only the commands in ``have`` (of the ones it checks) are on PATH."""
    repo, bin_dir = tmp_path / "repo", tmp_path / "bin"
    _stand_in(repo / "scripts" / "test", (SCRIPTS / "test").read_text())
    _stand_in(repo / "scripts" / "test-pythons")
    for tool in ("python", "ruff", "mypy"):
        _stand_in(repo / ".venv" / "bin" / tool)
    for tool in ("apt-get", "sudo", *have):
        _stand_in(bin_dir / tool, '#!/bin/sh\nexec "$@"\n' if tool == "sudo" else CALLED)  # sudo: when not root
    for real in ("bash", "dirname", "id", "basename"):
        (bin_dir / real).symlink_to(shutil.which(real) or f"/usr/bin/{real}")
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    run = subprocess.run([str(bin_dir / "bash"), str(repo / "scripts" / "test"), "-x"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=30, check=False)
    assert run.returncode == 0, run.stderr
    return [line.rstrip() for line in run.stdout.splitlines()]


def test_each_quiet_step_is_said_before_it_runs(tmp_path):
    lines = _run(tmp_path, have=("etcd", "nft", "chromium"))
    packages = "etcd-server etcd-client nftables prometheus chromium iptables"
    assert lines[:5] == [
        f"scripts/test: etcdctl prometheus iptables not found: installing Debian's {packages} with apt-get (a few "
        "minutes, quiet until done)",
        "scripts/test: apt-get update",
        "CALLED apt-get update -qq",
        f"scripts/test: apt-get install {packages}",
        # (apt-get install's own output goes to /dev/null)
        "scripts/test: system packages installed",
    ]
    pip = lines.index("CALLED python -m pip install -q --disable-pip-version-check -e .[test]")
    assert lines[pip - 1].startswith("scripts/test: pip: installing rankrun[test] into .venv (torch 2.13.0")
    assert lines[pip + 1:] == [
        "scripts/test: ruff check", "CALLED ruff check src tests bench examples",
        "scripts/test: mypy --strict", "CALLED mypy",
        "scripts/test: pytest: the whole suite (about 15-18 minutes on 2 cores, less on more)",
        "CALLED python -m pytest -x",  # the script's arguments go to that run
        "CALLED test-pythons .venv/bin/python",
    ]


def test_nothing_is_said_of_apt_when_every_command_is_there(tmp_path):
    lines = _run(tmp_path, have=("etcd", "etcdctl", "nft", "prometheus", "chromium", "iptables"))
    assert not [line for line in lines if "apt" in line]
    assert lines[0].startswith("scripts/test: pip: installing rankrun[test]")
