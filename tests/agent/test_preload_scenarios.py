"""The job's preloading process as the agent sequences it (``agent.preload``), on a fake spawner and a fake
preloader (the ``AgentDeps.preloader`` seam): started before any worker with the workers' interpreter, environment
and command line, its output on the console under ``[preload]``, its events with the first attempt's, its import
error the user's (exit 2, no worker), an unsafe state one line, and closed at the end."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from fakes import Behaviour, FakeHandle, FakeSpawner
from rankrun.agent.loop import AgentDeps, run_agent
from rankrun.cli import spec_from_args
from rankrun.errors import UsageError
from rankrun.logs.console import Console
from rankrun.proc.early import EarlyCatcher
from rankrun.proc.preload import Ready
from rankrun.proc.spawn import Command, Stdio
from rankrun.spec import LaunchSpec

SCENARIO_TIMEOUT = 30.0


class FakePreloader:
    def __init__(self, ready: Ready) -> None:
        self._ready = ready
        self.handle: FakeHandle | None = None
        self.started: tuple[tuple[str, ...], str, dict[str, str], list[str]] | None = None
        self.closed = False
        self.on_change = lambda _state, _why: None

    @property
    def pid(self) -> int | None:
        return self.handle.pid if self.handle is not None else None

    async def start(self, modules, python, env, argv) -> FakeHandle:
        self.started = (tuple(modules), python, dict(env), list(argv))
        self.handle = FakeHandle(4242, Command((python,), {}, Stdio.MERGED), Behaviour(stdout=b"an import warning\n"))
        return self.handle

    async def ready(self) -> Ready:
        return self._ready

    def stop(self) -> None:
        pass

    async def close(self) -> None:
        self.closed = True
        assert self.handle is not None
        self.handle.signal(9)  # its output ends with it


def _spec(tmp_path: Path, *flags: str) -> LaunchSpec:
    script = tmp_path / "train.py"
    script.write_text("")
    return spec_from_args([*flags, "--events", str(tmp_path / "events.jsonl"), str(script)],
                          {"PATH": "/usr/bin", "RANK": "7"})


def _run(tmp_path: Path, spec: LaunchSpec, spawner: FakeSpawner, preloader: FakePreloader) -> tuple[int, str, str]:
    out, err = tmp_path / "console.out", tmp_path / "console.err"
    catcher = EarlyCatcher(())
    with out.open("wb") as o, err.open("wb") as e:
        console = Console(o.fileno(), e.fileno())
        deps = AgentDeps(spawner, console, "testhost", preloader=preloader)  # type: ignore[arg-type]
        try:
            rc = asyncio.run(asyncio.wait_for(run_agent(spec, deps, catcher), SCENARIO_TIMEOUT))
        finally:
            console.close()
            catcher.restore()
    return rc, out.read_text(), err.read_text()


def _events(tmp_path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]


def test_a_ready_preloader_comes_first_and_is_closed_at_the_end(tmp_path):
    preloader = FakePreloader(Ready(2.5))
    spawner = FakeSpawner(lambda a, r: Behaviour(exit_status=1 if (a, r) == (0, 1) else 0))
    spec = _spec(tmp_path, "--nproc-per-node", "2", "--max-restarts", "1", "--preload", "torch,numpy")
    rc, _, err = _run(tmp_path, spec, spawner, preloader)
    assert rc == 0
    assert preloader.started is not None
    modules, python, env, argv = preloader.started
    assert modules == ("torch", "numpy") and python == spec.worker.entry.python
    assert argv == [python, "-u", str(tmp_path / "train.py")]  # the first worker's cold command line
    assert "RANK" not in env and env["PATH"] == "/usr/bin"  # nothing of one rank's, an outer launcher's neither
    assert "[preload] an import warning" in err.splitlines()
    assert preloader.closed
    kinds = [(e["event"], e.get("state"), e.get("attempt")) for e in _events(tmp_path)]
    assert kinds.index(("job.start", None, None)) == 0
    assert [k for k in kinds if k[0] in ("preload", "warm")] == [("preload", "ready", None), ("warm", None, 0),
                                                                  ("warm", None, 1)]
    (preload,) = [e for e in _events(tmp_path) if e["event"] == "preload"]
    assert preload["modules"] == "torch,numpy" and preload["seconds"] == 2.5
    warm = [e for e in _events(tmp_path) if e["event"] == "warm"]
    assert [(w["forked"], w["cold"]) for w in warm] == [("", "0-1"), ("", "0-1")]  # the fake spawner's are cold


def test_a_module_that_cannot_be_imported_is_the_users_error_and_no_worker_starts(tmp_path):
    preloader = FakePreloader(Ready(error=("torchx", "ModuleNotFoundError: No module named 'torchx'")))
    spawner = FakeSpawner(lambda a, r: Behaviour(exit_status=0))
    with pytest.raises(UsageError) as raised:
        _run(tmp_path, _spec(tmp_path, "--nproc-per-node", "2", "--preload", "torchx"), spawner, preloader)
    assert str(raised.value) == "--preload 'torchx': cannot be imported: ModuleNotFoundError: No module named 'torchx'"
    assert raised.value.exit_code == 2
    assert spawner.spawned == [] and preloader.closed
    assert _events(tmp_path)[-1]["event"] == "job.end"


def test_an_unsafe_state_is_one_line_and_its_event(tmp_path):
    why = "it has 2 threads ('Thread-1'): a module started a thread at import"
    preloader = FakePreloader(Ready(1.5, unsafe=why))
    spawner = FakeSpawner(lambda a, r: Behaviour(exit_status=0))
    rc, _, err = _run(tmp_path, _spec(tmp_path, "--nproc-per-node", "2", "--preload", "m"), spawner, preloader)
    assert rc == 0
    assert f"rankrun: --preload m: {why}; starting this node's workers cold" in err.splitlines()
    (preload,) = [e for e in _events(tmp_path) if e["event"] == "preload"]
    assert (preload["state"], preload["why"], preload["seconds"]) == ("unsafe", why, 1.5)


def test_a_change_during_the_job_is_said_once_and_told_with_the_next_attempt(tmp_path):
    preloader = FakePreloader(Ready(2.0))
    ended = "the preloading process ended (signal SIGKILL)"

    def after_spawn(handle: FakeHandle) -> None:
        if handle.command.attempt == 0 and handle.command.env["LOCAL_RANK"] == "0":
            preloader.on_change("ended", ended)

    spawner = FakeSpawner(lambda a, r: Behaviour(exit_status=1 if (a, r) == (0, 0) else 0), after_spawn=after_spawn)
    spec = _spec(tmp_path, "--nproc-per-node", "2", "--max-restarts", "1", "--preload", "m")
    rc, _, err = _run(tmp_path, spec, spawner, preloader)
    assert rc == 0
    assert err.splitlines().count(f"rankrun: --preload m: {ended}; starting this node's workers cold") == 1
    kinds = [(e["event"], e.get("state"), e.get("attempt")) for e in _events(tmp_path) if e["event"] in
             ("preload", "warm")]
    assert kinds == [("preload", "ready", None), ("preload", "ended", None), ("warm", None, 0), ("warm", None, 1)]
