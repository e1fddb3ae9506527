"""``--health-check``'s runner on real shells: the verdict, the reason line, the timeout that leaves nothing running,
the environment the check sees, and a cancelled check killed with everything it started.

A check that starts processes tells the test their pids through a FIFO the test holds open read-write (so neither side
blocks on open): the test reads them in ``on_spawn``, bounded by ``select``, before the check's timeout starts, so a
loaded machine cannot time the check out before the processes to look for exist."""

from __future__ import annotations

import asyncio
import os
import select
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import Reaper, clean_environ, wait_gone
from rankrun import procfs
from rankrun.health import check
from rankrun.health.check import REASON_CHARS, CheckResult, check_env, reason_from, run_check

WAIT = 30.0  # the bound on any wait for a check's processes to say who they are
EXITING = 5.0  # the bound on a killed process's exit (those not killed sleep 1000 s)


def _run(cmd: str, timeout: float = 30.0, env: dict[str, str] | None = None,
         on_spawn: Callable[[int], None] | None = None) -> CheckResult:
    return asyncio.run(run_check(cmd, clean_environ() if env is None else env, timeout, on_spawn=on_spawn))


class _Pids:
    """A FIFO the check writes pids to (one per line), read in ``on_spawn`` until ``count`` have arrived."""

    def __init__(self, tmp_path: Path, count: int, reaper: Reaper) -> None:
        self.path = tmp_path / "pids"
        os.mkfifo(self.path)
        self._fd = os.open(self.path, os.O_RDWR | os.O_NONBLOCK)
        self._count = count
        self._reaper = reaper
        self.pids: list[int] = []
        self.group: int | None = None

    def on_spawn(self, pgid: int) -> None:
        self.group = pgid
        self._reaper.pids.add(pgid)
        data = b""
        deadline = time.monotonic() + WAIT
        while data.count(b"\n") < self._count and (left := deadline - time.monotonic()) > 0:
            if select.select([self._fd], [], [], left)[0]:
                data += os.read(self._fd, 4096)
        os.close(self._fd)
        self.pids = [int(p) for p in data.split()]
        self._reaper.pids.update(self.pids)
        assert len(self.pids) == self._count, f"the check told {data!r}"

    def running(self) -> list[int]:
        """The check's processes still running in its group (a pid taken again by another process does not count).
        SIGKILLed and their pipe closed, they may still be finishing their exit: that is waited for, bounded."""
        assert self.group is not None
        return [p for p in wait_gone(self.pids, EXITING) if (fields := procfs.stat(p)) is not None
                and int(fields[2]) == self.group]


def test_exit_0_is_healthy() -> None:
    result = _run("echo all good; exit 0")
    assert result == CheckResult(healthy=True, reason="", seconds=result.seconds, exit_code=0)
    assert 0 < result.seconds < WAIT


def test_the_reason_is_the_last_non_empty_line_of_stdout_and_stderr() -> None:
    result = _run("echo one; echo; echo 'uncorrectable ECC error' >&2; echo '   ' ; exit 3")
    assert (result.healthy, result.reason, result.exit_code) == (False, "uncorrectable ECC error", 3)


def test_stdout_and_stderr_share_one_pipe_in_the_order_written() -> None:
    assert _run("echo first >&2; echo second; exit 1").reason == "second"
    assert _run("echo first; echo second >&2; exit 1").reason == "second"


def test_a_long_line_is_cut_to_200_characters() -> None:
    result = _run("printf 'x%.0s' $(seq 300); echo; exit 1")
    assert result.reason == "x" * REASON_CHARS
    assert REASON_CHARS == 200


def test_a_check_that_prints_nothing_says_how_it_ended() -> None:
    assert _run("exit 5").reason == "exited 5"
    killed = _run("kill -KILL $$")
    assert (killed.reason, killed.exit_code) == ("killed by SIGKILL", -9)


def test_a_chatty_check_is_read_as_it_writes_and_its_last_line_kept() -> None:
    # 8 MiB is far beyond the pipe's buffer: a runner that did not read while the check runs would time it out
    result = _run("head -c 8388608 /dev/zero | tr '\\0' y; echo; echo 'disk /scratch: 3 GiB free'; exit 1", timeout=60)
    assert (result.healthy, result.reason) == (False, "disk /scratch: 3 GiB free")


def test_control_characters_in_the_reason_are_blanked() -> None:
    assert _run("printf 'GPU 3\\033[31m lost\\n'; exit 1").reason == "GPU 3 [31m lost"


def test_only_the_outputs_tail_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(check, "TAIL_BYTES", 16)
    assert _run("printf 'abcdefghij\\nklmnopqrstuvwxyz0123456789'; exit 1").reason == "uvwxyz0123456789"


def test_what_the_pipe_still_holds_when_the_shell_has_exited_is_read(tmp_path: Path, reaper: Reaper,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # the check fills the pipe (all of it fits) and exits before the launcher reads a byte; read 16 bytes at a time,
    # its last line comes long after the launcher has heard the shell exit
    monkeypatch.setattr(check, "READ_CHUNK", 16)
    pids = _Pids(tmp_path, 1, reaper)

    def on_spawn(pgid: int) -> None:
        pids.on_spawn(pgid)
        assert wait_gone(pids.pids, WAIT) == []

    cmd = f"printf 'x%.0s' $(seq 30000); echo; echo 'the last line'; echo $$ > {pids.path}; exit 1"
    assert _run(cmd, on_spawn=on_spawn).reason == "the last line"


@pytest.mark.parametrize(("output", "code", "reason"), [
    (b"a\nb\n\n", 1, "b"),
    (b"a\r\n  b  \r\n", 1, "b"),
    (b"", 2, "exited 2"),
    (b" \n\t\n", 2, "exited 2"),
    (b"", -15, "killed by SIGTERM"),
    (b"", -99, "killed by signal 99"),
    (b"\xff\xfebad bytes\n", 1, "\ufffd\ufffdbad bytes"),
])
def test_reason_from(output: bytes, code: int, reason: str) -> None:
    assert reason_from(output, code) == reason


def test_a_hung_check_is_killed_at_its_timeout_with_its_whole_group(tmp_path: Path, reaper: Reaper) -> None:
    pids = _Pids(tmp_path, 3, reaper)
    cmd = f"sleep 1000 & echo $! > {pids.path}; sleep 1000 & echo $! > {pids.path}; echo $$ > {pids.path}; wait"
    result = _run(cmd, timeout=0.5, on_spawn=pids.on_spawn)
    assert result == CheckResult(healthy=False, reason="timed out after 0.5 s", seconds=result.seconds, exit_code=None)
    assert 0.5 <= result.seconds < WAIT
    assert pids.running() == []  # the shell and both sleeps: nothing is left running when run_check returns


def test_the_timeout_is_written_without_trailing_zeros(tmp_path: Path, reaper: Reaper) -> None:
    pids = _Pids(tmp_path, 1, reaper)
    result = _run(f"echo $$ > {pids.path}; exec sleep 1000", timeout=1.0, on_spawn=pids.on_spawn)
    assert result.reason == "timed out after 1 s"
    assert pids.running() == []


def test_a_check_that_exits_leaves_nothing_behind_it(tmp_path: Path, reaper: Reaper) -> None:
    # the background sleep keeps the pipe open after the shell exits: it is killed, not waited for
    pids = _Pids(tmp_path, 1, reaper)
    result = _run(f"sleep 1000 & echo $! > {pids.path}; echo fine; exit 0", on_spawn=pids.on_spawn)
    assert (result.healthy, result.exit_code) == (True, 0)
    assert pids.running() == []


def test_the_check_sees_the_launchers_environment_and_its_share_of_the_job() -> None:
    env = check_env({**clean_environ(), "SITE": "rack7"}, 8, "job-42")
    result = _run('echo "$LOCAL_WORLD_SIZE $TORCHELASTIC_RUN_ID $SITE ${NOT_GIVEN-unset}"; exit 1', env=env)
    assert result.reason == "8 job-42 rack7 unset"


def test_check_env_adds_to_a_copy() -> None:
    base = {"PATH": "/bin", "LOCAL_WORLD_SIZE": "1"}
    assert check_env(base, 4, "r") == {"PATH": "/bin", "LOCAL_WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "r"}
    assert base == {"PATH": "/bin", "LOCAL_WORLD_SIZE": "1"}


def test_a_cancelled_check_is_killed_with_its_whole_group(tmp_path: Path, reaper: Reaper) -> None:
    pids = _Pids(tmp_path, 2, reaper)

    async def main() -> None:
        spawned = asyncio.Event()

        def on_spawn(pgid: int) -> None:
            pids.on_spawn(pgid)
            spawned.set()

        cmd = f"sleep 1000 & echo $! > {pids.path}; echo $$ > {pids.path}; wait"
        task = asyncio.create_task(run_check(cmd, clean_environ(), 600, on_spawn=on_spawn))
        await asyncio.wait_for(spawned.wait(), WAIT)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, WAIT)

    asyncio.run(main())
    assert pids.running() == []
