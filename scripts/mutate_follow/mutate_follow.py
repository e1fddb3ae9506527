"""scripts/mutate's pytest plugin (``-p mutate_follow``): at the end of mutmut's stats run, the functions that the
processes a test started called (written by this folder's ``sitecustomize``) count as reached by that test, so
mutmut runs that test against their mutants."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    del session, exitstatus
    folder = os.environ.get("MUTATE_HITS")
    if os.environ.get("MUTANT_UNDER_TEST") != "stats" or not folder:
        return
    from mutmut.state import state  # noqa: PLC0415 - mutmut's record of this run

    for path in sorted(Path(folder).iterdir()):
        for line in path.read_text(encoding="utf-8").splitlines():
            test, _, name = line.partition("\t")
            if test and name:
                state().tests_by_mangled_function_name[name].add(test)
        path.unlink()
