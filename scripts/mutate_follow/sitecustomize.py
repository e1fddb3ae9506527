"""scripts/mutate's hook in every Python process a test starts (a launcher, its workers, ``python -m
rankrun.health``): on ``PYTHONPATH`` behind the mutants, so it runs as such a process starts.

mutmut first runs the tests once to learn which tests reach which function (``MUTANT_UNDER_TEST=stats``): each
mutated function's trampoline records that it was called, in the test's own process. A process the test started
would record it in its own memory, lost when it exits, after reading mutmut's configuration relative to its working
directory (a test's temporary folder: mutmut cannot find the code there and the process dies). Here, in that run
only, each function such a process calls is written instead, with the test that started it (``PYTEST_CURRENT_TEST``,
which it inherits), to a file of its own under ``MUTATE_HITS``; ``mutate_follow``, a pytest plugin in the
test's process, adds them to mutmut's record at the session's end. The mutants themselves need nothing: a process
inherits ``MUTANT_UNDER_TEST`` and runs the mutant it names.

Any other ``sitecustomize`` further along ``sys.path`` is run after this one, as if this one were not there.
"""

from __future__ import annotations

import os
import sys


def _follow() -> None:
    folder = os.environ.get("MUTATE_HITS")
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0].removeprefix("mutants/")
    if os.environ.get("MUTANT_UNDER_TEST") != "stats" or not folder or not test:
        return
    try:
        from mutmut.mutation import trampoline  # noqa: PLC0415 - only in the stats run
    except ImportError:
        return
    seen: set[str] = set()
    path = os.path.join(folder, str(os.getpid()))

    def record(name: str, caller: str | None = None) -> None:
        del caller
        if name in seen:
            return
        seen.add(name)
        with open(path, "a", encoding="utf-8") as out:  # a line at once: the process may be killed any time
            out.write(f"{test}\t{name}\n")

    trampoline.record_trampoline_hit = record  # type: ignore[assignment]


def _chain() -> None:
    """Run the next ``sitecustomize`` on ``sys.path`` (this folder's is shadowing it)."""
    import importlib.machinery  # noqa: PLC0415
    import importlib.util  # noqa: PLC0415

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_follow()
_chain()
