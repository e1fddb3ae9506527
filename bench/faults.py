"""Silent network faults, timed: python bench/faults.py [--reps 5] [--torch-reps 1] [--cap 60] [--json]

Three hosts in network namespaces on one bridge (``tests/netns.py``), one gloo worker each looping
in all_reduce (``tests/payloads/gloo_loop.py``), the rendezvous hosted on host 0, a keep-alive
window of 3 s (``keep_alive_interval=1,keep_alive_max_attempt=3``), ``--shutdown-timeout 2``. Faults
are silent (no RST, no FIN):

- **cut** (``--nnodes 2:3``, ``last_call_timeout=5`` so that all three form the first round): the
  switch drops every frame of host 2 (an nftables bridge rule). Timed from the cut:
  (a) the survivors' first all_reduce in the smaller world (their READY line), (b) the cut-off
  agent's exit;
- **dark** (``--nnodes 2:3``, ``last_call_timeout=1``): host 0 (the rendezvous) takes its own
  interface down. Timed: its members' exits, and the host's own exit (left alone, below MIN=2:
  after ``last_call_timeout``).

rankrun runs ``--reps`` times (medians), each measurement capped at ``--cap`` s (a capped figure
reads "> cap"). Target, from the issue: (a) and (b) within window + shutdown timeout + 2 s = 7 s.
Needs root, iproute2 and nftables.

torchrun's c10d runs the cut ``--torch-reps`` times beside it, with the same settings (told
``--local-addr``, ``is_host`` and ``GLOO_SOCKET_IFNAME``: these hosts' name resolves to 127.0.0.1);
it leaves both to gloo's timeout and TCP's retransmissions, so its figures read "> cap".
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import netns
from harness import PYTHON, bench_env, stop

PAYLOAD = Path(__file__).resolve().parent.parent / "tests" / "payloads" / "gloo_loop.py"
CONF = "keep_alive_interval=1,keep_alive_max_attempt=3"
LAUNCHERS = {"rankrun": (PYTHON, "-m", "rankrun"), "torchrun": (PYTHON, "-m", "torch.distributed.run")}
TARGET = 3.0 + 2.0 + 2.0


class Agent:
    """One launcher on one host; its output lines (both streams) go to a queue, stamped on arrival."""

    def __init__(self, argv: Sequence[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(list(argv), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.lines: queue.Queue[tuple[float, str]] = queue.Queue()
        self.seen: list[str] = []
        self.ended: float | None = None  # when it exited, stamped by the reader thread (not when someone asked)
        self._done = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.put((time.monotonic(), raw.decode(errors="replace").rstrip()))
        self.proc.wait()  # its stdout closed: it is exiting (its workers write through it, never to it)
        self.ended = time.monotonic()
        self._done.set()

    def wait_for(self, pattern: str, timeout: float) -> float | None:
        """When a line matching ``pattern`` came (bounded); None if none did in time."""
        rx, deadline = re.compile(pattern), time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                when, line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            self.seen.append(line)
            if rx.search(line):
                return when
        return None

    def exited(self, timeout: float) -> float | None:
        self._done.wait(timeout)
        return self.ended


def _start(sw: netns.Switch, launcher: str, finish: Path, min_nodes: int, last_call: int) -> list[Agent]:
    env = bench_env() | {"RANKRUN_RDZV_SECRET": "faults", "FINISH_FILE": str(finish)}
    args = ["--nnodes", f"{min_nodes}:3", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{sw.addr(0)}:29400",
            "--rdzv-id", "faults", "--shutdown-timeout", "2", "--nproc-per-node", "1"]
    agents: list[Agent] = []
    for i in range(3):
        conf = f"last_call_timeout={last_call},{CONF}"
        host_env = dict(env)
        if launcher == "torchrun":  # this host's name resolves to loopback: torchrun must be told address, interface, host
            conf += f",is_host={int(i == 0)}"
            host_env["GLOO_SOCKET_IFNAME"] = sw.dev(i)
            extra: tuple[str, ...] = ("--local-addr", sw.addr(i))
        else:
            extra = ()
        agents.append(Agent((*sw.exec(i), *LAUNCHERS[launcher], *args, *extra, "--rdzv-conf", conf, str(PAYLOAD)), host_env))
        if i == 0 and launcher == "torchrun":  # its other agents give up at once on an endpoint nobody listens on yet
            _listening(sw, 29400, 120)
    for agent in agents:
        if agent.wait_for(r"READY rank \d world 3", 120) is None:
            seen = [a.seen[-3:] for a in agents]
            raise RuntimeError(f"{launcher}: the job did not form: {seen}")
    return agents


def _listening(sw: netns.Switch, port: int, timeout: float) -> None:
    """Wait (bounded) until host 0 listens on ``port``: no line announces it for torchrun, so ask the kernel."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run([*sw.exec(0), "ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, check=False)
        if out.stdout.strip():
            return
        time.sleep(0.05)  # nothing to wait on but the kernel's table
    raise RuntimeError(f"host 0 never listened on {port}")


def _since(start: float, when: float | None, cap: float) -> float | None:
    return None if when is None or when - start > cap else when - start


def cut(launcher: str, cap: float) -> dict[str, float | None]:
    with netns.switch(3, nft=True) as sw, tempfile.TemporaryDirectory() as tmp:
        agents = _start(sw, launcher, Path(tmp) / "finish", 2, 5)
        try:
            start = time.monotonic()
            sw.cut(2)
            survivors = [a.wait_for(r"READY rank \d world 2", cap) for a in agents[:2]]
            reformed = None if None in survivors else max(s for s in survivors if s is not None)
            exited = agents[2].exited(max(0.0, start + cap - time.monotonic()))
            return {"survivors_reformed": _since(start, reformed, cap), "cut_off_agent_exited": _since(start, exited, cap)}
        finally:
            (Path(tmp) / "finish").touch()
            for agent in agents:
                stop(agent.proc)


def dark(cap: float) -> dict[str, float | None]:
    with netns.switch(3) as sw, tempfile.TemporaryDirectory() as tmp:
        agents = _start(sw, "rankrun", Path(tmp) / "finish", 2, 1)
        try:
            start = time.monotonic()
            sw.link_down(0)
            members = [a.exited(cap) for a in agents[1:]]
            host = agents[0].exited(max(0.0, start + cap - time.monotonic()))
            last = None if None in members else max(m for m in members if m is not None)
            return {"members_exited": _since(start, last, cap), "host_exited": _since(start, host, cap)}
        finally:
            for agent in agents:
                stop(agent.proc)


def _median(values: list[float | None], cap: float) -> str:
    if any(v is None for v in values):
        return f"> {cap:g} s (capped)"
    return f"{statistics.median(v for v in values if v is not None):.2f} s"


def _samples(values: list[float | None]) -> str:
    return ", ".join("capped" if v is None else f"{v:.2f}" for v in values)


Runs = dict[str, list[dict[str, float | None]]]
FAULTS = (  # (fault, what is timed, the key in a run, its target)
    ("cut: host 2's switch port drops everything", "the survivors' first all_reduce in world 2", "survivors_reformed", TARGET),
    ("cut", "the cut-off agent exits (3)", "cut_off_agent_exited", TARGET),
    ("dark: host 0 (the rendezvous) takes its link down", "its members exit (3)", "members_exited", TARGET),
    ("dark", "the host, left alone below MIN, exits (3)", "host_exited", TARGET + 1.0),  # + last_call_timeout
)
PARTITION_REPS = 5


def possible() -> str | None:
    """Why these faults cannot be made here, or None."""
    if os.geteuid() != 0:
        return "not root (network namespaces need it)"
    if shutil.which("ip") is None or shutil.which("nft") is None:
        return "iproute2 or nftables missing"
    return None


def run(reps: int, torch_reps: int, cap: float, say: Callable[[str], None] = lambda _line: None) -> Runs:
    runs: Runs = {"cut": [], "dark": [], "torchrun cut": []}
    for rep in range(max(reps, torch_reps)):
        if rep < torch_reps:
            runs["torchrun cut"].append(cut("torchrun", cap))
        if rep < reps:
            runs["cut"].append(cut("rankrun", cap))
            runs["dark"].append(dark(cap))
        say(f"  faults rep {rep + 1}: {json.dumps({k: v[-1] for k, v in runs.items() if len(v) > rep})}")
    return runs


def table(runs: Runs, cap: float) -> list[str]:
    lines = ["| fault | time from the fault until | launcher | samples (s) | median | target |", "|---|---|---|---|---|---|"]
    for fault, what, key, target in FAULTS:
        kind = fault.split(":")[0]
        for launcher, name in (("rankrun", kind), ("torchrun", f"torchrun {kind}")):
            values = [r[key] for r in runs.get(name, [])]
            if values:
                lines.append(f"| {fault} | {what} | {launcher} | {_samples(values)} | {_median(values, cap)} | ≤ {target:g} s |")
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--torch-reps", type=int, default=1)
    parser.add_argument("--cap", type=float, default=60.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    why = possible()
    if why is not None:
        print(f"bench/faults.py: {why}", file=sys.stderr)
        return 2
    runs = run(args.reps, args.torch_reps, args.cap, lambda line: print(line, file=sys.stderr, flush=True))
    print(json.dumps(runs, indent=1) if args.json else "\n".join(table(runs, args.cap)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
