"""Small filesystem helpers the launcher needs, without ``tempfile``/``shutil``.

Those two modules pull in ``random``, ``hashlib``, ``fnmatch`` and friends: about 1.5 MB of
resident memory in a process whose whole budget is 25 MB. These few lines do the part we use.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path


def which(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """Like ``shutil.which``: the executable file ``name`` resolves to via PATH (``env``'s, else ours), or None."""
    candidates = [name] if os.sep in name else [os.path.join(d, name) for d in os.get_exec_path(env)]
    for path in candidates:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def temp_root() -> Path:
    return Path(os.environ.get("TMPDIR") or "/tmp")


def make_unique_dir(parent: Path, prefix: str) -> Path:
    """Create ``parent/<prefix><random>`` (mode 0700) that did not exist before, like ``mkdtemp``."""
    for _ in range(100):
        path = parent / f"{prefix}{os.urandom(4).hex()}"
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"no unique name for {prefix!r} in {parent}")


def remove_tree(path: Path) -> None:
    """Remove ``path`` and everything below it; missing entries are fine (like ``rmtree(ignore_errors=True)``)."""
    if not path.is_dir() or path.is_symlink():
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            path.unlink()
        return
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(root, name))
        for name in dirs:
            full = os.path.join(root, name)
            with contextlib.suppress(OSError):
                os.unlink(full) if os.path.islink(full) else os.rmdir(full)
    with contextlib.suppress(OSError):
        path.rmdir()
