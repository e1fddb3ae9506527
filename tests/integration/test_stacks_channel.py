"""The dump channel on real processes: the shim in a worker, a dump on request (also with the GIL held in C),
the user's own sitecustomize and PYTHONPATH untouched, and workers that cannot answer."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import clean_environ
from rankrun.proc.spawn import main_thread_kill
from rankrun.stacks import sampler as sampling
from rankrun.stacks.channel import DUMP_SIGNAL, RUNNING_SIGNAL, channel_env, running_file
from rankrun.stacks.report import RankSample
from rankrun.stacks.sampler import Sampler, Target, proc_stat

READY_TIMEOUT = 30.0

# Writes what it sees, then READY, then parks in a function whose name the test looks for.
WORKER = """\
import json, os, re, sys, time
out = sys.argv[1]
seen = {"PYTHONPATH": os.environ.get("PYTHONPATH"), "leaked": sorted(k for k in os.environ if k.startswith("RANKRUN_")),
        "sys_path_has_shim": any(p.endswith(os.path.join("stacks", "shim")) for p in sys.path),
        "user_site": os.environ.get("USER_SITECUSTOMIZE_RAN")}
open(out + ".env", "w").write(json.dumps(seen))

def parked_in_a_distinct_place():
    if sys.argv[2] == "child":
        import subprocess
        subprocess.Popen(["sleep", "60"])  # a DataLoader worker's stand-in: listed, never signalled
    open(out + ".ready", "w").close()
    if sys.argv[2] == "exec":
        os.execv("/bin/sleep", ["sleep", "60"])  # the shim's header stays, its handler does not
    if sys.argv[2] == "regex":
        re.match(r"(a+)+$", "a" * 40 + "b")  # exponential backtracking, all of it in C with the GIL held
    if sys.argv[2] == "spin":
        holding_the_gil_in_c()
    if sys.argv[2] == "busy":
        import threading
        threading.Thread(target=a_side_thread, daemon=True).start()
        busy_in_python(time.monotonic() + 60)
    time.sleep(60)

def holding_the_gil_in_c():
    while True:
        sum(range(10**8))  # a second or two in C each

def a_side_thread():
    time.sleep(60)

def busy_in_python(until):
    while time.monotonic() < until:
        sum(i * i for i in range(100))

parked_in_a_distinct_place()
"""


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait(timeout=30)


def _start(workers: list[subprocess.Popen[bytes]], tmp_path: Path, name: str, mode: str = "sleep",
           env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], Path]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    dump = tmp_path / f"{name}.stacks"
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / name), mode],
                            env=channel_env(env or clean_environ(), str(dump)))
    workers.append(proc)
    deadline = time.monotonic() + READY_TIMEOUT
    while not (tmp_path / f"{name}.ready").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the worker did not get ready"
        time.sleep(0.01)
    return proc, dump


def _sample(*targets: Target, timeout: float = 5.0) -> list[RankSample]:
    return asyncio.run(Sampler().sample(targets, timeout=timeout))


def _target(rank: int, proc: subprocess.Popen[bytes], dump: Path | None) -> Target:
    def signal(signum: int) -> bool:  # as WorkerHandle.signal: nothing once reaped
        if proc.returncode is not None:
            return False
        os.kill(proc.pid, signum)
        return True

    def signal_main(signum: int) -> bool:  # as WorkerHandle.signal_main
        return proc.returncode is None and bool(main_thread_kill(proc.pid, signum))

    return Target(rank, "here", proc.pid, dump, signal, signal_main)


def test_a_worker_answers_with_every_thread_and_leaves_no_trace_in_its_environment(tmp_path, workers) -> None:
    proc, dump = _start(workers, tmp_path, "w0")
    seen = json.loads((tmp_path / "w0.env").read_text())
    assert seen == {"PYTHONPATH": None, "leaked": [], "sys_path_has_shim": False, "user_site": None}
    (sample,) = _sample(_target(0, proc, dump))
    assert sample.dump is not None and sample.dump.main is not None
    assert sample.dump.main.frames[-1].function == "parked_in_a_distinct_place"  # time.sleep has no Python frame
    deadline = time.monotonic() + READY_TIMEOUT
    while sample.proc is not None and sample.proc.state == "R" and time.monotonic() < deadline:
        # on a loaded machine the worker may not be back in its sleep yet when /proc is read: the dump's signal just
        # woke it; asked again, a parked worker shows it (bounded)
        (sample,) = _sample(_target(0, proc, dump))
    assert sample.proc is not None and sample.proc.state == "S"
    assert proc.poll() is None  # asking did not disturb it


# The dump's signal blocked in the main thread alone, with a thread beside it that would take it: sent to the process,
# that thread would answer at once with its own stack; sent to the main thread, it waits until the main thread sees it
# pending (bounded) and unblocks it, and the answer is the main thread's stack.
MAIN_BLOCKS = """\
import signal, sys, threading, time
sig = int(sys.argv[2])

def a_thread_that_would_take_it():
    time.sleep(60)

def main_waits_with_the_signal_blocked():
    threading.Thread(target=a_thread_that_would_take_it, daemon=True).start()
    signal.pthread_sigmask(signal.SIG_BLOCK, {sig})  # after the start: the other thread does not block it
    open(sys.argv[1] + ".ready", "w").close()
    deadline = time.monotonic() + 10
    while sig not in signal.sigpending() and time.monotonic() < deadline:
        time.sleep(0.005)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})  # faulthandler's handler runs here
    time.sleep(60)

main_waits_with_the_signal_blocked()
"""


def test_the_dump_is_the_main_threads_stack_whichever_thread_could_take_the_signal(tmp_path, workers) -> None:
    script = tmp_path / "blocks.py"
    script.write_text(MAIN_BLOCKS)
    dump = tmp_path / "w6.stacks"
    env = channel_env(clean_environ(), str(dump))
    del env["RANKRUN_STACKS_RUNNING"]  # faulthandler's way alone: its loop may be running when asked
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "w6"), str(int(DUMP_SIGNAL))], env=env)
    workers.append(proc)
    deadline = time.monotonic() + READY_TIMEOUT
    while not (tmp_path / "w6.ready").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the worker did not get ready"
        time.sleep(0.01)
    (sample,) = _sample(_target(6, proc, dump), timeout=15.0)
    assert sample.dump is not None and sample.dump.main is not None, sample
    assert [t.main for t in sample.dump.threads] == [True]  # one thread's stack: the main one's, by the header's id
    assert sample.dump.main.ident == int(dump.read_text().split()[1].removeprefix("main=0x"), 16) and sample.answered
    functions = [f.function for f in sample.dump.main.frames]
    assert functions[:2] == ["<module>", "main_waits_with_the_signal_blocked"], functions  # then signal's wrapper
    assert "a_thread_that_would_take_it" not in functions
    assert proc.poll() is None


def test_a_workers_children_are_listed_with_their_state(tmp_path, workers) -> None:
    proc, dump = _start(workers, tmp_path, "w4", mode="child")
    (sample,) = _sample(_target(4, proc, dump))
    assert [(c.name, c.state) for c in sample.children] == [("sleep", "S")]
    for child in sample.children:
        os.kill(child.pid, 9)


def test_a_worker_holding_the_gil_in_c_still_answers(tmp_path, workers) -> None:
    proc, dump = _start(workers, tmp_path, "w1", mode="regex")
    (sample,) = _sample(_target(1, proc, dump))
    assert sample.dump is not None and sample.dump.main is not None
    assert [f.function for f in sample.dump.main.frames][-2:] == ["parked_in_a_distinct_place", "match"]
    assert sample.proc is not None and sample.proc.state == "R"


def test_a_worker_in_c_with_the_gil_held_is_asked_from_c_and_python_answers_later(tmp_path, workers) -> None:
    proc, dump = _start(workers, tmp_path, "w8", mode="spin")  # sum() over a range: C, the GIL held, no signal checks
    (sample,) = _sample(_target(8, proc, dump))
    assert sample.dump is not None and sample.dump.main is not None, sample
    assert sample.dump.main.frames[-1].function == "holding_the_gil_in_c"
    assert "Stack (most recent call first):" in dump.read_text()  # faulthandler's answer: Python's could not come yet
    deadline = time.monotonic() + READY_TIMEOUT
    while "\n\n" not in (late := running_file(dump).read_text() if running_file(dump).exists() else ""):
        assert time.monotonic() < deadline, "the Python handler never answered"  # it does once that sum() returns
        time.sleep(0.01)
    assert late.startswith("Current thread") and "in holding_the_gil_in_c" in late, late  # in its own file


def test_a_worker_running_python_answers_from_python_with_every_thread(tmp_path, workers) -> None:
    proc, dump = _start(workers, tmp_path, "w7", mode="busy")

    def busy(sample: RankSample) -> bool:  # asked while running its loop (not still starting the other thread)
        main = sample.dump.main if sample.dump is not None else None
        return main is not None and "busy_in_python" in [f.function for f in main.frames][-2:]  # or its generator

    deadline = time.monotonic() + READY_TIMEOUT
    while True:  # on a loaded machine it may wait for a core (still R), or be caught between two looks: bounded
        (sample,) = _sample(_target(7, proc, dump))
        if (sample.proc is not None and sample.proc.state == "R" and busy(sample)) or time.monotonic() > deadline:
            break
    assert sample.dump is not None and sample.dump.main is not None and busy(sample), sample
    assert [t.frames[-1].function for t in sample.dump.others] == ["a_side_thread"]  # the shim's own thread: none
    assert "Current thread" in running_file(dump).read_text()
    assert "Stack (most recent call first):" not in dump.read_text()  # faulthandler was not asked


def test_the_users_pythonpath_and_sitecustomize_are_kept(tmp_path, workers) -> None:
    site = tmp_path / "usersite"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITECUSTOMIZE_RAN'] = 'yes'\n")
    env = clean_environ() | {"PYTHONPATH": str(site)}
    proc, dump = _start(workers, tmp_path, "w2", env=env)
    seen = json.loads((tmp_path / "w2.env").read_text())
    assert seen == {"PYTHONPATH": str(site), "leaked": [], "sys_path_has_shim": False, "user_site": "yes"}
    (sample,) = _sample(_target(2, proc, dump))
    assert sample.dump is not None  # and the dumps still work


def test_workers_that_cannot_answer_are_described_not_signalled(tmp_path, workers) -> None:
    sleeper = subprocess.Popen(["sleep", "60"], env=channel_env(clean_environ(), str(tmp_path / "s.stacks")))
    workers.append(sleeper)
    proc, dump = _start(workers, tmp_path, "w3")
    os.kill(proc.pid, 19)  # SIGSTOP: it cannot run its handler
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    workers.append(gone)
    gone.wait(timeout=30)
    not_python, stopped, exited = _sample(_target(0, sleeper, tmp_path / "s.stacks"), _target(1, proc, dump),
                                          _target(2, gone, None), timeout=1.0)
    assert not_python.dump is None and not_python.proc is not None and not_python.proc.state == "S"
    assert sleeper.poll() is None  # never sent the dump signal (its default action would have ended it)
    assert stopped.dump is None and not stopped.answered and stopped.proc is not None and stopped.proc.state == "T"
    assert exited.proc is None
    os.kill(proc.pid, 18)  # SIGCONT: the pending request is answered late, and nothing breaks


def test_a_worker_that_exec_d_another_program_is_not_signalled(tmp_path, workers) -> None:
    proc, dump = _start(workers, tmp_path, "w5", mode="exec")
    deadline = time.monotonic() + READY_TIMEOUT
    while Path(f"/proc/{proc.pid}/comm").read_text().strip() != "sleep":
        assert time.monotonic() < deadline, "the worker did not exec"
        time.sleep(0.01)
    assert dump.read_bytes().startswith(b"rankrun-stacks main=")
    (sample,) = _sample(_target(5, proc, dump), timeout=1.0)
    assert sample.dump is None and sample.proc is not None
    assert proc.poll() is None  # the signal's default action would have ended it


def test_the_cpu_figure_is_seconds_as_the_process_itself_counts_them() -> None:
    """/proc/<pid>/stat counts CPU time in clock ticks (``SC_CLK_TCK`` a second, not milliseconds): read wrongly,
    a spinning rank would look idle. This process spins, then its figure must agree with its own CPU clock."""
    spin_until = time.process_time() + 0.3
    while time.process_time() < spin_until:
        pass  # CPU time for the figure to show (this process's clock: nothing to wait for)
    before = time.process_time()
    stat = proc_stat(os.getpid())
    after = time.process_time()
    assert stat is not None
    assert before - 0.05 <= stat[1] <= after + 0.05  # the kernel's figure is in whole ticks (10 ms at 100 a second)


def test_a_sample_says_the_cpu_each_worker_used_since_the_last_one(workers) -> None:
    """None at a worker's first sample; then what it used since (not in all): a spinning worker its CPU, a sleeping
    one none. A worker reaped meanwhile is sampled as gone, and the others still are."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    sleeper = subprocess.Popen(["sleep", "60"])
    gone = subprocess.Popen(["true"])
    workers += [spinner, sleeper, gone]
    gone.wait(timeout=READY_TIMEOUT)
    targets = [_target(2, gone, None), _target(0, spinner, None), _target(1, sleeper, None)]  # the gone one first
    sampler = Sampler()

    async def spun(at_least: float) -> float:
        deadline = time.monotonic() + READY_TIMEOUT
        while (cpu := _cpu(spinner.pid)) < at_least:
            assert time.monotonic() < deadline, "the spinner got no CPU"
            await asyncio.sleep(0.02)  # CPU time accrues; nothing announces it
        return cpu

    async def main() -> tuple[list[RankSample], list[RankSample], float, float]:
        before = await spun(0.3)  # used before the first sample: not to be counted at the second
        first = await sampler.sample(targets)
        await spun(_cpu(spinner.pid) + 0.3)
        second = await sampler.sample(targets)
        return first, second, before, _cpu(spinner.pid)

    first, second, before, after = asyncio.run(main())
    assert [s.proc.cpu if s.proc else "gone" for s in first] == [None, None, "gone"]
    assert second[2] == RankSample(2, "here", None, None)
    spinning, sleeping = second[0].proc, second[1].proc
    assert spinning is not None and sleeping is not None and spinning.state == "R" and sleeping.state == "S"
    assert spinning.cpu is not None and 0.3 <= spinning.cpu <= after - before  # between the samples, not since the start
    assert sleeping.cpu is not None and sleeping.cpu < 0.05


def _cpu(pid: int) -> float:
    stat = proc_stat(pid)
    assert stat is not None
    return stat[1]


def test_a_sample_not_kept_is_taken_back_out_of_the_file_and_samples_take_turns(tmp_path, workers) -> None:
    proc, dump = _start(workers, tmp_path, "w")
    header = dump.stat().st_size
    target = _target(0, proc, dump)

    async def both() -> tuple[list[RankSample], list[RankSample]]:
        sampler = Sampler()  # a watch's samples, not kept, beside a report's, kept: neither loses its dump
        return await asyncio.gather(sampler.sample([target], 5.0, keep=False), Sampler().sample([target], 5.0))

    watched, reported = asyncio.run(both())
    for sample in (watched, reported):
        main = sample[0].dump.main if sample[0].dump is not None else None
        assert main is not None and main.frames[-1].function == "parked_in_a_distinct_place", sample
    kept = dump.stat().st_size
    assert kept > header  # the report's dump stays
    for _ in range(5):
        (again,) = asyncio.run(Sampler().sample([target], 5.0, keep=False))
        assert again.dump is not None and again.dump.main is not None
    assert dump.stat().st_size == kept  # five more, taken back


def test_a_running_worker_counts_as_in_c_only_once_its_main_thread_used_cpu_since_it_was_asked() -> None:
    """The fallback's rule, on this process's own main thread: a thread that has not had a core since it was asked
    may have stopped in the middle of Python, and is not read from C."""
    me = Target(0, "here", os.getpid(), None, lambda _signum: True)
    cpu = sampling._main_thread_cpu(os.getpid())
    assert cpu is not None
    asked = sampling._Asked(me, Path("/nowhere"), 0, int(RUNNING_SIGNAL), 1, 0.0, "R", cpu)
    assert not sampling._ran_since(asked)  # no CPU since (below a tick's rounding)
    spin_until = time.thread_time() + 2 * sampling.RAN + 0.02
    while time.thread_time() < spin_until:
        pass  # this thread's own CPU time, which is what is counted
    assert sampling._ran_since(asked)
    assert not sampling._ran_since(sampling._Asked(me, Path("/nowhere"), 0, int(RUNNING_SIGNAL), 1, 0.0, "R", None))
