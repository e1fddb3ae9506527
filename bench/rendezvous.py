"""One complete rendezvous round with M simulated agents: ``python bench/rendezvous.py --nodes M [--json] [--torch]``.

rankrun: one host process serves the embedded store and runs the coordinator (as the hosting agent does); M
simulated agents, asyncio tasks spread over a few processes, each with its own connection, join and wait for
their assignment — exactly ``Member.join`` + ``Member.next_round``, the code a real agent runs. Reported: wall
seconds from "go" to the last assignment received, store operations per node (requests on its connection), and
bytes per node (both directions, handshake included).

``--check CMD``: each simulated agent first runs ``CMD`` as its ``--health-check`` (``health.check.run_check``, as
the agent does before it joins the first round), all at once; the round then counts from "go" to the last
assignment as before. ``cpu_s`` in the JSON: CPU seconds of the agents' processes, their checks and the host.

``--torch``: the same M with torch's own c10d ``DynamicRendezvousHandler`` (threads in a few processes, one
TCPStore connection each, torch's TCPStore server in a host process), stopped at ``--bound`` seconds and then
reported as "did not complete".

``--backend etcd``: the same round on a single-member etcd the bench starts (and kills) itself, on a fresh
loopback address: the coordinator process and the agents talk to it through rankrun's etcd client
(``store.etcd.store``), each agent with its own client (its own connections). Operations per node are the
requests it makes (a watch counts one); bytes are not counted.

``--failover``: a 3-member etcd; a client holding a lease and a watch (as an agent does) through all three
endpoints; the leader is SIGKILLed and the bench times, from the kill, the first keep-alive the cluster
accepts again and the first watch event delivered after it (a put made once the keep-alive succeeded).
``--reps`` times (the killed member rejoins between them); the median and every value are reported.

``--partition``: the same, but the leader is cut off instead of killed, silently (no RST, no FIN: a switch
drops its frames), in network namespaces the bench makes and removes (root, iproute2 and nftables): one
member a host, the client on a fourth. The client holds a lease through all three endpoints and talks
to the leader; right after the cut it sends a keep-alive, and the bench times from the cut until the
cluster accepts it (the client leaves the silent member after its attempt bound and waits out the
election). With a 3 s lease (keep_alive_interval=1, keep_alive_max_attempt=3) and the default 15 s,
``--reps`` times each (the member is healed and rejoins between them).

The last line with ``--json`` is one object: ``nodes``, ``seconds``, ``ops_per_node``, ``bytes_per_node``
(and ``completed``); with ``--failover``: ``keepalive_s`` and ``watch_s`` lists and their medians; with
``--partition``: per lease (``"3"``, ``"15"``) a ``keepalive_s`` list, its median and how many leases were kept.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent / "src"))
sys.path.insert(0, str(BENCH.parent / "tests"))  # etcdserver: the tests' etcd processes, one piece of code for both

SECRET = b"bench-secret"
ROUND_BOUND = 300.0  # seconds an agent waits to connect, and then for its assignment, before it counts as failed
# connects in flight at once in one agents process. Its simulated nodes share two cores, where real nodes have one
# each: with thousands in flight together, every handshake advances a little each turn, each node's own connect takes
# as long as its whole process's (16 s for 8,192), and the liveness window (15 s) ends them all, the simulator's
# queue and not the host deciding. The host still meets the whole crowd, as fast as the simulators can send it.
IN_FLIGHT = 256
# processes the simulated agents are spread over: one per core. More only add switches between them (each turn of a
# process's loop then serves fewer of its agents): 16,384 nodes on this 2-core machine took 9.8-10.4 s with 4, 8.8-9.2 s
# with 2 (BENCHMARKS.md, *Fewer round trips*)
PROCS = os.cpu_count() or 4
# seconds: a simulated agent's connection as a job's by default (``--rdzv-conf keep_alive_interval``, 3 attempts): its
# relay (or the host) pings it after this long idle, and it answers; a node waiting 29 s for its round answers 5 pings,
# as many frames as its round's own work (BENCHMARKS.md, *Fewer round trips*: 32,768 nodes with 60 s: 24.3-25.3 s)
KEEP_ALIVE = 5.0


# --------------------------------------------------------------------------- rankrun: the host


async def _host(nodes: int, group: int = 0) -> None:
    from rankrun.fdlimit import raise_soft_limit
    from rankrun.main import collect_less_often
    from rankrun.rendezvous.coordinator import Coordinator
    from rankrun.rendezvous.keys import Keys
    from rankrun.rendezvous.round import Settings
    from rankrun.store.embedded.routing import Routing, relays_for
    from rankrun.store.embedded.server import StoreServer
    from rankrun.store.memory import MemoryStore

    raise_soft_limit()  # as the launcher does at start (rankrun.main)
    collect_less_often()
    if os.environ.get("RDZV_LOG"):  # the host's own lines (a connection given up, a relay lost) on stderr
        import logging

        logging.basicConfig(level=logging.INFO, format="host %(asctime)s %(message)s")
    memory = MemoryStore()
    # --relay-group: the host chooses relays as the launcher's does (every simulated node connects: nodes + 1 would
    # count a hosting node of its own, which the bench's host is not)
    server = StoreServer(memory, SECRET, routing=Routing(relays_for(nodes + 1, group)) if group else None)
    port = await server.start("127.0.0.1", 0)

    async def nothing() -> None:
        return None

    coordinator = Coordinator(memory, Keys.for_run("bench"), Settings(nodes, nodes, 3600.0, 0),
                              master=lambda: ("127.0.0.1", port), before_round=nothing)
    task = asyncio.create_task(coordinator.run())
    print(f"READY {port}", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the bench closes our stdin
    task.cancel()
    await server.close()
    await memory.close()


# --------------------------------------------------------------------------- rankrun: simulated agents


async def _agents(port: int, count: int, index: int, check: str | None = None, lead: int = 0, *,
                  keep_alive: float = KEEP_ALIVE) -> None:
    """``lead`` > 0: the host routes (``--relay-group``); this process's first ``lead`` agents connect before its
    others, so that the agents the host asks to relay are spread over the processes as relays over nodes would be
    (one process holding every relay's agents would pass its open-files limit: no node holds another's relay)."""
    from rankrun.health.check import check_env, run_check
    from rankrun.rendezvous.keys import Assignment, Keys
    from rankrun.rendezvous.member import Member
    from rankrun.rendezvous.round import NodeInfo
    from rankrun.store.embedded import client as client_module
    from rankrun.store.embedded.client import StoreClient
    from rankrun.store.embedded.relay import Relay

    counted: dict[int, list[int]] = {}  # id(client) -> [ops, bytes]
    original_call = StoreClient.call
    original_received = client_module._Protocol.data_received
    original_made = client_module._Protocol.connection_made

    async def call(self: StoreClient, op: str, **fields: object) -> object:
        counted.setdefault(id(self), [0, 0])[0] += 1
        return await original_call(self, op, **fields)

    def received(self: client_module._Protocol, data: bytes) -> None:
        counted.setdefault(id(self._client), [0, 0])[1] += len(data)
        original_received(self, data)

    def made(self: client_module._Protocol, transport: asyncio.BaseTransport) -> None:
        original_made(self, transport)
        write = transport.write  # type: ignore[attr-defined]
        stats = counted.setdefault(id(self._client), [0, 0])

        def counting_write(data: bytes) -> None:
            stats[1] += len(data)
            write(data)

        transport.write = counting_write  # type: ignore[attr-defined]

    original_tell = StoreClient.tell

    def tell(self: StoreClient, op: str, **fields: object) -> None:  # a request whose reply is not awaited counts too
        counted.setdefault(id(self), [0, 0])[0] += 1
        original_tell(self, op, **fields)

    StoreClient.call = call  # type: ignore[method-assign]
    StoreClient.tell = tell  # type: ignore[method-assign]
    client_module._Protocol.data_received = received  # type: ignore[method-assign]
    client_module._Protocol.connection_made = made  # type: ignore[method-assign]
    keys = Keys.for_run("bench")
    env = check_env(os.environ, 1, "bench")
    print("READY", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # "go"
    cpu = _cpu_self()
    phases: list[tuple[float, float, float]] = []  # per agent: connected, joined, assigned (monotonic)
    failed: list[str] = []

    async def agent(i: int) -> None:
        try:
            if check is not None:  # --health-check before the first round, before joining, as multinode's agent does
                result = await run_check(check, env, 60.0)
                assert result.healthy, result
            if i >= lead:
                await leads.wait()
            try:
                async with connecting:
                    client = await _connect(port, relays=lead > 0, keep_alive=keep_alive)
                    agents.append(client)
                    if client.serve is not None:  # asked by the host to relay (--relay-group): here, as an agent's
                        relay = Relay(SECRET)
                        await relay.start("127.0.0.1", 0, ("127.0.0.1", port), token=client.serve)
                        relays.append(relay)
            finally:
                if i < lead:  # connected (or failed: reported below): the others go once every lead one did
                    led.append(i)
                    if len(led) == lead:
                        waiting.append(asyncio.ensure_future(every_process_led()))
            connected = time.monotonic()
            # a fixed-width id, as a real one (``session.node_info``: host-pid-6 hex digits): none is a prefix of
            # another, so a node's prefix watch of its assign key sees only its own
            info = NodeInfo(f"p{index}-a{i:06d}", 0, 1, "default", "127.0.0.1", "bench", None, False)
            member = await Member.join(client, keys, info, ttl=3600.0)
            joined = time.monotonic()
            got = await asyncio.wait_for(member.next_round(0), ROUND_BOUND)
            assert isinstance(got, Assignment)
            phases.append((connected, joined, time.monotonic()))
        except Exception as exc:  # one failed agent is reported, not a hung bench
            failed.append(f"{type(exc).__name__}: {exc}")

    agents: list[StoreClient] = []
    relays: list[Relay] = []
    led: list[int] = []
    waiting: list[asyncio.Future[None]] = []  # every_process_led, held until it is done
    connecting = asyncio.Semaphore(IN_FLIGHT)
    leads = asyncio.Event()
    if lead == 0:
        leads.set()
    lags = [0.0]  # the longest turn of this process's loop: past a few seconds the simulator, not the host, is slow

    async def lag() -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(0.1)
            lags[0] = max(lags[0], loop.time() - before - 0.1)

    async def every_process_led() -> None:
        """This process's lead agents are connected: say so, and let its others go once every process's are (the bench
        says when): relays are asked in arrival order, and a process whose others went first would take more than its
        share of them (one reached 16,005 descriptors of its 20,000, and another, past them, stopped a round)."""
        await loop.run_in_executor(None, lambda: print("LED", flush=True))
        await loop.run_in_executor(None, sys.stdin.readline)  # "all led"
        leads.set()

    loop = asyncio.get_running_loop()
    lagging = asyncio.create_task(lag())
    await asyncio.gather(*(agent(i) for i in range(count)))
    lagging.cancel()
    cpu = _cpu_self() - cpu
    ops = sum(v[0] for v in counted.values())
    moved = sum(v[1] for v in counted.values())
    report = json.dumps({"last": max((p[2] for p in phases), default=0.0), "ops": ops, "bytes": moved, "count": count,
                         "cpu": cpu, "phases": phases, "failed": len(failed), "error": failed[0] if failed else "",
                         "lag": round(lags[0], 3)})
    # written from a thread: the report (~40 bytes a node) is past a pipe's 64 KiB, and the bench reads the processes in
    # turn; a write on the loop would stop it until then, and with it this process's relays, whose agents in the other
    # processes, still waiting for their assignments, would hear nothing for their liveness window
    await loop.run_in_executor(None, lambda: print(report, flush=True))
    await loop.run_in_executor(None, sys.stdin.readline)  # "exit"
    for client in agents:
        await client.close()
    for relay in relays:
        await relay.close()


async def _connect(port: int, host: str = "127.0.0.1", *, relays: bool = False, keep_alive: float = KEEP_ALIVE) -> object:
    """Connect as an agent does (``session._connect``): a connection that fails or times out (a SYN dropped by a full
    listen queue, a handshake slower than the liveness window on a loaded machine) is tried again with backoff; its
    liveness that of a job with ``keep_alive_interval=keep_alive`` (and 3 attempts, the default)."""
    from rankrun.rendezvous.session import CONNECT_RETRY
    from rankrun.store.api import StoreUnavailable
    from rankrun.store.embedded.client import StoreClient
    from rankrun.store.embedded.liveness import Liveness

    liveness = Liveness.of_lease(keep_alive, 3)

    deadline, pause = time.monotonic() + ROUND_BOUND, CONNECT_RETRY[0]
    while True:
        try:
            return await StoreClient.connect(host, port, SECRET, liveness=liveness, relays=relays)
        except StoreUnavailable:  # also the host's "no relay is ready yet" (--relay-group)
            if time.monotonic() + pause > deadline:
                raise
        await asyncio.sleep(pause)
        pause = min(pause * 2, CONNECT_RETRY[1])


def _run_agents(port: int, count: int, index: int, check: str | None, lead: int, *, keep_alive: float) -> None:
    from rankrun.fdlimit import raise_soft_limit

    raise_soft_limit()  # its agents' connections and its relays' (``run_rankrun``), as a launcher raises its own
    # no collections in a simulator process: a real agent's collector scans one agent's objects, here it would scan
    # the thousands of agents this process holds each time (4.4 s of a 16,384-node round's 29.8 s of CPU), a cost of
    # the simulation that no node pays; a round's garbage is freed by reference counting, and the process ends
    gc.disable()
    if check is not None:  # the launcher's own child watcher (rankrun.main): 3.11's default runs a thread per child
        from rankrun.main import _use_pidfd_child_watcher

        _use_pidfd_child_watcher()
    asyncio.run(_agents(port, count, index, check, lead, keep_alive=keep_alive))


def _cpu_self() -> float:
    """CPU seconds of this process and of the children it reaped (the checks' shells)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def cpu_of(pid: int) -> float:
    """CPU seconds of a running process (/proc/<pid>/stat: utime + stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_rankrun(nodes: int, procs: int, check: str | None = None, relays: int = 0, group: int = 0, *,
                keep_alive: float = KEEP_ALIVE) -> dict[str, object]:
    """One round of ``nodes`` simulated agents; ``check``: each runs it as its ``--health-check`` before joining;
    ``relays``: that many relay processes (``store.embedded.relay``) between the agents and the host, each agents
    process's agents through one of them (process i: relay i mod R). The result's ``cpu_s``: CPU seconds of the agents
    (their checks included), the relays and the host, from "go" to the last assignment; ``fds_max``: the most file
    descriptors one process held (the host, a relay, an agents process), sampled at the end. ``group``: the host chooses
    relays as the launcher's does (``--rdzv-conf relay_group``): the first agents to arrive each run one, in their
    agents' process, for ``group`` others; ``host_fds``: the host's descriptors then."""
    if group:  # the relays run in the agents processes, each process's share of them (its lead agents connect first,
        # ``every_process_led``): a process holds its agents' connections and about as many of its relays' agents, so
        # at most half its open-files limit, less a margin (8,976 agents here, under a hard limit of 20,000)
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        procs = max(procs, -(-nodes // ((hard - 2048) // 2)))
    py = sys.executable
    profile = ["-m", "cProfile", "-o", os.environ["RDZV_PROFILE"]] if os.environ.get("RDZV_PROFILE") else []
    host = subprocess.Popen([py, *profile, __file__, "--role", "host", "--nodes", str(nodes), "--relay-group", str(group)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    children: list[subprocess.Popen[str]] = []
    relaying: list[subprocess.Popen[str]] = []
    checking = ["--check", check] if check is not None else []
    checking += ["--keep-alive", f"{keep_alive:g}"]
    if group:  # each agents process's first few connect first: they are the ones asked to relay
        from rankrun.store.embedded.routing import relays_for

        checking += ["--lead", str(-(-relays_for(nodes + 1, group) // procs))]
    try:
        assert host.stdout is not None
        port = int(host.stdout.readline().split()[1])
        ports = [port]
        for r in range(relays):
            profiled = [*profile[:-1], f"{profile[-1]}.relay{r}"] if profile else []
            relaying.append(subprocess.Popen([py, *profiled, __file__, "--role", "relay", "--port", str(port)],
                                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        if relays:
            ports = [int(r.stdout.readline().split()[1]) for r in relaying if r.stdout is not None]
        before = {p.pid: cpu_of(p.pid) for p in (host, *relaying)}
        start = _start_agents(children, nodes, procs, lambda i, share: [
            "--role", "agents", "--port", str(ports[i % len(ports)]), "--count", str(share), "--index", str(i), *checking])
        if group:  # each process's lead agents connected: then all the others go (``every_process_led``)
            _step(children, "LED", "all led")
        result = _collect(children, start, nodes, count_bytes=True)
        spent = {pid: cpu_of(pid) - cpu for pid, cpu in before.items()}
        result["fds_max"] = max(_fds(p.pid) for p in (host, *relaying, *children))
        if group:
            result |= {"relay_group": group, "host_fds": _fds(host.pid)}
        result["cpu_s"] = round(float(result.pop("agents_cpu_s")) + sum(spent.values()), 3)  # type: ignore[arg-type]
        result["host_cpu_s"] = round(spent[host.pid], 3)
        if relays:
            result["relays"] = relays
            result["relays_cpu_s"] = round(sum(spent.values()) - spent[host.pid], 3)
        return result
    finally:
        for child in children:
            end_process(child)
        for relay in relaying:
            end_process(relay)
        end_process(host)


def _fds(pid: int) -> int:
    with contextlib.suppress(OSError):
        return len(os.listdir(f"/proc/{pid}/fd"))
    return 0


async def _relay(port: int) -> None:
    from rankrun.store.embedded.relay import Relay

    relay = Relay(SECRET)
    own = await relay.start("127.0.0.1", 0, ("127.0.0.1", port))
    print(f"READY {own}", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the bench closes our stdin
    await relay.close()


def _collect(children: list[subprocess.Popen[str]], start: float, nodes: int, *, count_bytes: bool) -> dict[str, object]:
    """Each agents process's report → the round's figures; then tell them to exit."""
    reports = []
    for child in children:
        assert child.stdout is not None
        line = child.stdout.readline()  # "" if it died: counted as its agents failed, not a hung bench
        reports.append(json.loads(line) if line else {"last": 0.0, "ops": 0, "bytes": 0, "count": 0, "failed": 1,
                                                        "error": f"an agents process exited {child.wait()}"})
    seconds = max(r["last"] for r in reports) - start
    for child in children:
        assert child.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            child.stdin.write("exit\n")
            child.stdin.flush()
    failed = sum(int(r.get("failed", 0)) for r in reports)
    result: dict[str, object] = {
        "nodes": nodes, "seconds": round(seconds, 3), "completed": not failed,
        "agents_cpu_s": sum(r.get("cpu", 0.0) for r in reports),
        "agents_lag_max_s": max(r.get("lag", 0.0) for r in reports),
        "ops_per_node": round(sum(r["ops"] for r in reports) / nodes, 2),
        "bytes_per_node": round(sum(r["bytes"] for r in reports) / nodes) if count_bytes else None}
    if failed:
        result |= {"failed": failed, "error": next(r["error"] for r in reports if r.get("error"))}
    phases = [p for r in reports for p in r.get("phases", ())]
    if phases:  # when the agents were connected, joined, assigned: the median and the last, seconds from "go"
        result["phases_s"] = {name: [round(_quantile([p[k] - start for p in phases], q), 3) for q in (0.5, 1.0)]
                              for k, name in enumerate(("connected", "joined", "assigned"))}
    return result


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _start_agents(
    children: list[subprocess.Popen[str]], nodes: int, procs: int, args: Callable[[int, int], list[str]], *, quiet: bool = False
) -> float:
    """Spread ``nodes`` agents over ``procs`` processes, wait for each to be READY, say "go"; the monotonic start time."""
    shares = [nodes // procs + (1 if i < nodes % procs else 0) for i in range(procs)]
    for i, share in enumerate(s for s in shares if s):
        profile = ["-m", "cProfile", "-o", f"{os.environ['RDZV_PROFILE']}.agents{i}"] if os.environ.get("RDZV_PROFILE") else []
        children.append(subprocess.Popen([sys.executable, *profile, __file__, *args(i, share)], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL if quiet else None, text=True))
    return _step(children, "READY", "go")


def _step(children: list[subprocess.Popen[str]], heard: str, say: str) -> float:
    """Wait for every agents process to say ``heard``, then tell each ``say``; the monotonic time between."""
    for child in children:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == heard
    between = time.monotonic()
    for child in children:
        assert child.stdin is not None
        child.stdin.write(f"{say}\n")
        child.stdin.flush()
    return between


def end_process(proc: subprocess.Popen[str]) -> None:
    if proc.stdin is not None and not proc.stdin.closed:
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)
    if proc.stdout is not None:
        proc.stdout.close()


# --------------------------------------------------------------------------- rankrun on etcd


def _etcd_store(endpoints: str) -> object:
    from rankrun.spec import parse_etcd_endpoints
    from rankrun.store.etcd.gateway import Gateway
    from rankrun.store.etcd.store import EtcdStore

    return EtcdStore(Gateway(parse_etcd_endpoints(endpoints), retry_for=30.0))


async def _etcd_host(endpoints: str, nodes: int) -> None:
    from rankrun.rendezvous.coordinator import Coordinator
    from rankrun.rendezvous.keys import Keys
    from rankrun.rendezvous.round import Settings

    store = _etcd_store(endpoints)

    async def nothing() -> None:
        return None

    coordinator = Coordinator(store, Keys.for_run("bench"), Settings(nodes, nodes, 3600.0, 0),  # type: ignore[arg-type]
                              master=lambda: ("127.0.0.1", 29500), before_round=nothing)
    task = asyncio.create_task(coordinator.run())
    print("READY 0", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    task.cancel()
    await store.close()  # type: ignore[attr-defined]


async def _etcd_agents(endpoints: str, count: int, index: int) -> None:
    from rankrun.rendezvous.keys import Assignment, Keys
    from rankrun.rendezvous.member import Member
    from rankrun.rendezvous.round import NodeInfo
    from rankrun.store.etcd.gateway import Gateway

    ops = [0]
    original_call, original_stream = Gateway.call, Gateway.open_stream

    async def call(self: Gateway, path: str, body: dict[str, object], **bounds: float | None) -> dict[str, object]:
        ops[0] += 1
        return await original_call(self, path, body, **bounds)  # type: ignore[arg-type]

    async def stream(self: Gateway, path: str, body: dict[str, object]) -> object:
        ops[0] += 1
        return await original_stream(self, path, body)

    Gateway.call = call  # type: ignore[method-assign]
    Gateway.open_stream = stream  # type: ignore[method-assign,assignment]
    keys = Keys.for_run("bench")
    print("READY", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # "go"
    done: list[float] = []
    stores: list[object] = []

    async def agent(i: int) -> None:
        store = _etcd_store(endpoints)
        stores.append(store)
        info = NodeInfo(f"p{index}-a{i}", 0, 1, "default", "127.0.0.1", "bench", None, False)
        member = await Member.join(store, keys, info, ttl=3600.0)  # type: ignore[arg-type]
        got = await member.next_round(0)
        assert isinstance(got, Assignment)
        done.append(time.monotonic())

    await asyncio.gather(*(agent(i) for i in range(count)))
    print(json.dumps({"last": max(done), "ops": ops[0], "bytes": 0, "count": count}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # "exit"
    for store in stores:
        await store.close()  # type: ignore[attr-defined]


def run_etcd(nodes: int, procs: int) -> dict[str, object]:
    import tempfile

    from etcdserver import etcd_cluster

    with tempfile.TemporaryDirectory() as tmp, etcd_cluster(Path(tmp), 1) as cluster:
        host = subprocess.Popen([sys.executable, __file__, "--role", "etcd-host", "--nodes", str(nodes), "--endpoints",
                                 cluster.endpoints], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        children: list[subprocess.Popen[str]] = []
        try:
            assert host.stdout is not None
            host.stdout.readline()
            start = _start_agents(children, nodes, procs, lambda i, share: [
                "--role", "etcd-agents", "--endpoints", cluster.endpoints, "--count", str(share), "--index", str(i)])
            result = _collect(children, start, nodes, count_bytes=False)
            del result["agents_cpu_s"]  # not counted on etcd
            return result
        finally:
            for child in children:
                end_process(child)
            end_process(host)


async def _failover_once(cluster: object) -> tuple[float, float]:
    """Kill the leader; seconds until a keep-alive is accepted again, and until a watch event arrives after it."""
    store = _etcd_store(cluster.endpoints)  # type: ignore[attr-defined]
    try:
        lease = await store.grant(30)  # type: ignore[attr-defined]
        _, revision = await store.range("/failover/")  # type: ignore[attr-defined]
        watch = await store.watch("/failover/", revision)  # type: ignore[attr-defined]
        events = watch.__aiter__()
        leader = await asyncio.to_thread(cluster.leader)  # type: ignore[attr-defined]
        killed = time.monotonic()
        await asyncio.to_thread(cluster.kill, leader)  # type: ignore[attr-defined]
        await lease.keep_alive()  # the client fails over (and waits out the election) by itself
        alive = time.monotonic() - killed
        await store.put("/failover/k", b"after")  # type: ignore[attr-defined]
        event = await asyncio.wait_for(anext(events), 60)
        assert event.value == b"after"
        seen = time.monotonic() - killed
        await watch.close()
        await lease.revoke()
        await asyncio.to_thread(cluster.start, leader, "existing")  # type: ignore[attr-defined]
        await asyncio.to_thread(cluster.wait_healthy, [leader])  # type: ignore[attr-defined]
        return alive, seen
    finally:
        await store.close()  # type: ignore[attr-defined]


def run_failover(reps: int) -> dict[str, object]:
    import statistics
    import tempfile

    from etcdserver import etcd_cluster

    with tempfile.TemporaryDirectory() as tmp, etcd_cluster(Path(tmp), 3) as cluster:
        results = [asyncio.run(_failover_once(cluster)) for _ in range(reps)]
    keepalive, watch = [round(r[0], 3) for r in results], [round(r[1], 3) for r in results]
    return {"reps": reps, "keepalive_s": keepalive, "watch_s": watch, "keepalive_median": statistics.median(keepalive),
            "watch_median": statistics.median(watch)}


PARTITION_LEASES = (3.0, 15.0)  # seconds: keep_alive_interval x keep_alive_max_attempt, 1 x 3 and the default 5 x 3


async def _partition_client(endpoints: str, ttl: float) -> None:
    """On the fourth host: hold a lease (its first member is the leader); at each "go", one keep-alive, timed."""
    from rankrun.store.api import StoreUnavailable

    store = _etcd_store(endpoints)
    lease = await store.grant(ttl)  # type: ignore[attr-defined]
    await lease.keep_alive()
    print("READY", flush=True)
    loop = asyncio.get_running_loop()
    while (await loop.run_in_executor(None, sys.stdin.readline)).strip() == "go":
        try:
            await lease.keep_alive()  # the client fails over (and waits out the election) by itself
            print(json.dumps({"at": time.monotonic(), "member": store.gateway.serving.host}), flush=True)  # type: ignore[attr-defined]
        except StoreUnavailable as exc:
            print(json.dumps({"at": time.monotonic(), "lost": str(exc)}), flush=True)
    with contextlib.suppress(StoreUnavailable):
        await lease.revoke()
    await store.close()  # type: ignore[attr-defined]


def _partition_once(sw: object, cluster: object, ttl: float) -> dict[str, object]:
    """Cut the leader off; seconds from the cut until a keep-alive is accepted, and whether the lease was kept."""
    leader = cluster.leader()  # type: ignore[attr-defined]
    members = cluster.members  # type: ignore[attr-defined]
    endpoints = ",".join(m.endpoint for m in [leader, *(m for m in members if m is not leader)])
    client = subprocess.Popen([*sw.exec(3), sys.executable, __file__, "--role", "partition-client", "--endpoints",  # type: ignore[attr-defined]
                               endpoints, "--ttl", str(ttl)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert client.stdout is not None
        assert client.stdin is not None
        assert client.stdout.readline().strip() == "READY"
        sw.cut(members.index(leader))  # type: ignore[attr-defined]
        cut = time.monotonic()
        client.stdin.write("go\n")
        client.stdin.flush()
        answer = json.loads(client.stdout.readline())
        return {"seconds": answer["at"] - cut, "kept": "lost" not in answer, "why": answer.get("lost", "")}
    finally:
        sw.heal()  # type: ignore[attr-defined]
        end_process(client)
        cluster.wait_healthy([leader])  # type: ignore[attr-defined]


def run_partition(reps: int) -> dict[str, object]:
    import shutil
    import statistics
    import tempfile

    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("nft") is None:
        raise SystemExit("--partition needs root, iproute2 and nftables (network namespaces and a switch that drops frames)")
    import netns
    from etcdserver import etcd_cluster

    results: dict[str, object] = {"reps": reps}
    with tempfile.TemporaryDirectory() as tmp, netns.switch(4, nft=True) as sw, etcd_cluster(
            Path(tmp), 3, addresses=[sw.addr(i) for i in range(3)], prefixes=[sw.exec(i) for i in range(3)]) as cluster:
        for ttl in PARTITION_LEASES:
            runs = [_partition_once(sw, cluster, ttl) for _ in range(reps)]
            seconds = [round(float(r["seconds"]), 3) for r in runs]  # type: ignore[arg-type]
            results[f"{ttl:g}"] = {"keepalive_s": seconds, "keepalive_median": statistics.median(seconds),
                                   "kept": sum(bool(r["kept"]) for r in runs), "lost": [r["why"] for r in runs if r["why"]]}
    return results


# --------------------------------------------------------------------------- torch's c10d rendezvous


def _torch_host() -> None:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=True)
    print(f"READY {store.port}", flush=True)
    sys.stdin.read()


def _torch_agents(port: int, count: int, nodes: int, bound: float) -> None:
    import datetime
    import threading

    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler, RendezvousTimeout

    print("READY", flush=True)
    sys.stdin.readline()
    done: list[float] = []
    timeout = RendezvousTimeout(join=datetime.timedelta(seconds=bound), last_call=datetime.timedelta(seconds=3600))

    def agent() -> None:
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=bound + 30))
        handler = DynamicRendezvousHandler.from_backend(
            run_id="bench", store=store, backend=C10dRendezvousBackend(store, "bench"), min_nodes=nodes, max_nodes=nodes,
            local_addr="127.0.0.1", timeout=timeout)  # node ids stay unique: torch adds the pid and a counter
        try:
            handler.next_rendezvous()
            done.append(time.monotonic())
        except Exception:
            pass

    threads = [threading.Thread(target=agent, daemon=True) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(bound + 60)
    print(json.dumps({"last": max(done) if done else 0.0, "done": len(done), "count": count}), flush=True)
    os._exit(0)  # torch's keep-alive threads would hold the process


def run_torch(nodes: int, procs: int, bound: float) -> dict[str, object]:
    py = sys.executable
    host = subprocess.Popen([py, __file__, "--role", "torch-host"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    children: list[subprocess.Popen[str]] = []
    try:
        assert host.stdout is not None
        port = int(host.stdout.readline().split()[1])
        start = _start_agents(children, nodes, procs, lambda i, share: [
            "--role", "torch-agents", "--port", str(port), "--count", str(share), "--index", str(i), "--nodes", str(nodes),
            "--bound", str(bound)], quiet=True)
        reports = []
        for child in children:
            assert child.stdout is not None
            line = child.stdout.readline()
            reports.append(json.loads(line) if line else {"last": 0.0, "done": 0, "count": 0})
        completed = sum(r["done"] for r in reports) == nodes
        seconds = max(r["last"] for r in reports) - start if completed else float(bound)
        return {"nodes": nodes, "seconds": round(seconds, 3), "completed": completed, "ops_per_node": None,
                "bytes_per_node": None}
    finally:
        for child in children:
            end_process(child)
        end_process(host)


# --------------------------------------------------------------------------- CLI


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=1024, help="simulated agents (M)")
    parser.add_argument("--procs", type=int, default=PROCS, help="processes the simulated agents share (default: one per core)")
    parser.add_argument("--relays", type=int, default=0,
                        help="embedded: relay processes between the agents and the host (agents process i: relay i mod R)")
    parser.add_argument("--relay-group", type=int, default=0,
                        help="embedded: the host chooses relays as the launcher does (--rdzv-conf relay_group=K)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on the last line")
    parser.add_argument("--torch", action="store_true", help="torch's c10d DynamicRendezvousHandler instead of rankrun")
    parser.add_argument("--bound", type=float, default=60.0, help="seconds before torch's run counts as not completed")
    parser.add_argument("--backend", choices=("embedded", "etcd"), default="embedded", help="rankrun's store")
    parser.add_argument("--keep-alive", type=float, default=KEEP_ALIVE,
                        help="the simulated agents' keep_alive_interval (s): a connection idle this long is pinged, and given "
                             "up after 3 (default: the job's default, 5)")
    parser.add_argument("--check", default=None,
                        help="embedded: each simulated agent runs this --health-check command before it joins")
    parser.add_argument("--failover", action="store_true", help="time an etcd leader failover instead (3 members)")
    parser.add_argument("--partition", action="store_true",
                        help="time a keep-alive after the etcd leader is partitioned off instead (3 members, namespaces, root)")
    parser.add_argument("--reps", type=int, default=5, help="--failover, --partition: how many per lease")
    parser.add_argument("--ttl", type=float, default=3.0, help=argparse.SUPPRESS)
    parser.add_argument("--role", default="bench", help=argparse.SUPPRESS)
    parser.add_argument("--endpoints", default="", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--lead", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    roles: dict[str, Callable[[], object]] = {
        "host": lambda: asyncio.run(_host(args.nodes, args.relay_group)),
        "agents": lambda: _run_agents(args.port, args.count, args.index, args.check, args.lead,
                                      keep_alive=args.keep_alive),
        "relay": lambda: asyncio.run(_relay(args.port)),
        "etcd-host": lambda: asyncio.run(_etcd_host(args.endpoints, args.nodes)),
        "etcd-agents": lambda: asyncio.run(_etcd_agents(args.endpoints, args.count, args.index)),
        "partition-client": lambda: asyncio.run(_partition_client(args.endpoints, args.ttl)),
        "torch-host": _torch_host,
        "torch-agents": lambda: _torch_agents(args.port, args.count, args.nodes, args.bound),
    }
    if args.role in roles:
        roles[args.role]()
        return 0
    if args.failover:
        failover = run_failover(args.reps)
        print(json.dumps(failover) if args.json else
              f"etcd leader SIGKILLed: keep-alive accepted again after {failover['keepalive_median']} s, a watch event "
              f"after {failover['watch_median']} s (medians of {args.reps}: {failover['keepalive_s']}, {failover['watch_s']})")
        return 0
    if args.partition:
        partition = run_partition(args.reps)
        if args.json:
            print(json.dumps(partition))
            return 0
        for ttl in PARTITION_LEASES:
            row = partition[f"{ttl:g}"]
            assert isinstance(row, dict)
            print(f"etcd leader partitioned ({ttl:g} s lease): keep-alive accepted again after {row['keepalive_median']} s, "
                  f"lease kept {row['kept']}/{args.reps} (median of {args.reps}: {row['keepalive_s']})"
                  + (f"; lost: {row['lost']}" if row["lost"] else ""))
        return 0
    if args.torch:
        result = run_torch(args.nodes, args.procs, args.bound)
    elif args.backend == "etcd":
        result = run_etcd(args.nodes, args.procs)
    else:
        result = run_rankrun(args.nodes, max(args.procs, args.relays), args.check, args.relays, args.relay_group,
                             keep_alive=args.keep_alive)
    if args.json:
        print(json.dumps(result))
    else:
        done = f"{result['seconds']} s" if result["completed"] else f"did not complete within {args.bound:.0f} s"
        extra = ""
        if result["ops_per_node"] is not None:
            moved = f" and {result['bytes_per_node']} bytes" if result["bytes_per_node"] else ""
            extra = f", {result['ops_per_node']} store operations{moved} per node"
        name = "torch c10d" if args.torch else f"rankrun ({args.backend})"
        print(f"{name}: {args.nodes} nodes: {done}{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
