"""How the spawner starts a worker (``OsSpawner._how_to_start``): under ``setpriv`` with no pre-exec hook, so the
launcher can vfork, unless the worker needs a hook anyway (a terminal to take, CPUs to bind) or there is no
``setpriv``; a program ``setpriv`` would not find is a spawn error before anything starts."""

from __future__ import annotations

import pytest

from rankrun.errors import SpawnError
from rankrun.proc.spawn import Command, OsSpawner, Stdio

SETPRIV = ("/usr/bin/setpriv", "--pdeathsig", "KILL", "--")
ENV = {"PATH": "/usr/bin:/bin"}


def test_a_plain_worker_runs_under_setpriv_without_a_hook():
    argv, hook = OsSpawner(wrapper=SETPRIV)._how_to_start(Command(("sh", "-c", "true"), ENV))
    assert argv == (*SETPRIV, "sh", "-c", "true")
    assert hook is None


@pytest.mark.parametrize("command", [
    Command(("sh",), ENV, stdio=Stdio.TERMINAL),  # the hook takes the terminal
    Command(("sh",), ENV, cpus=frozenset({0})),  # the hook binds the CPUs
], ids=["terminal", "cpus"])
def test_a_worker_that_needs_a_hook_gets_one_and_no_setpriv(command):
    spawner = OsSpawner(wrapper=SETPRIV)
    argv, hook = spawner._how_to_start(command)
    assert argv == ("sh",)
    assert callable(hook)
    if command.cpus is None:
        assert hook is spawner._hooks[True]  # the terminal's hook, made once with the spawner
    else:
        assert hook not in spawner._hooks.values()  # a hook of its own, that binds this worker's CPUs


def test_without_setpriv_the_hook_sets_the_death_signal():
    argv, hook = OsSpawner(wrapper=())._how_to_start(Command(("sh",), ENV))
    assert argv == ("sh",)
    assert callable(hook)


def test_a_program_setpriv_would_not_find_is_refused_before_the_spawn():
    with pytest.raises(SpawnError, match=r"^cannot start worker no-such-program-h5 a b \.\.\.: No such file or directory$"):
        OsSpawner(wrapper=SETPRIV)._how_to_start(Command(("no-such-program-h5", "a", "b", "c"), ENV))


def test_the_program_is_looked_for_on_the_workers_own_path():
    with pytest.raises(SpawnError, match=r"^cannot start worker sh: No such file or directory$"):
        OsSpawner(wrapper=SETPRIV)._how_to_start(Command(("sh",), {"PATH": "/nonexistent-h5"}))
