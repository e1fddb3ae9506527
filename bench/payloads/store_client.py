"""torch's TCPStore client against both servers, for ``store_bench`` (the same client code for each).

Usage: ``store_client.py --clients N NAME=PORT [NAME=PORT ...]``: opens N ``TCPStore(is_master=False)`` clients to every
named server, then prints ``READY`` and obeys commands on stdin, one per line, answering each with one JSON line:

- ``LAT OP ITERS NAME [NAME ...]``: with client 0 of each NAME, time ITERS calls of OP, in chunks of ``CHUNK`` calls
  that alternate between the servers (so both see the same background noise), after unrecorded warm-up calls;
  answers ``{name: [p50_us, p90_us]}``.
- ``GO NAME OP START DURATION``: every client of NAME, each in its own thread, repeats OP from monotonic time START
  (``time.monotonic()`` is system-wide) until START + DURATION; answers ``{"ops": completed, "threads": N}``.

torch's store calls release the GIL while they wait on the socket, so N threads keep up to N requests in flight.
EOF on stdin exits.
"""

import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import torch.distributed as dist

VALUE = b"v" * 128
CHUNK = 50
Op = Callable[[dist.TCPStore, str], object]


def set_get(store: dist.TCPStore, key: str) -> object:
    store.set(key, VALUE)
    return store.get(key)  # the client sends WAIT [key] then GET key


OPS: dict[str, Op] = {
    "set+get": set_get,
    "add": lambda store, key: store.add(key + "n", 1),
    "wait": lambda store, key: store.wait([key]),
    "check": lambda store, key: store.check([key]),
}


def latency(stores: dict[str, dist.TCPStore], op: Op, iters: int) -> dict[str, list[float]]:
    clock = time.perf_counter_ns
    samples: dict[str, list[int]] = {name: [] for name in stores}
    for store in stores.values():
        for _ in range(CHUNK):
            op(store, "lat")
    for _ in range(0, iters, CHUNK):
        for name, store in stores.items():
            record = samples[name].append
            for _ in range(CHUNK):
                t0 = clock()
                op(store, "lat")
                record(clock() - t0)
    return {name: [statistics.median(s) / 1000, statistics.quantiles(s, n=10)[8] / 1000] for name, s in samples.items()}


def throughput(stores: list[dist.TCPStore], op: Op, start: float, duration: float) -> int:
    end = start + duration
    counts = [0] * len(stores)
    ready = threading.Barrier(len(stores))

    def loop(i: int) -> None:
        store, key, n = stores[i], f"k{i}", 0
        ready.wait()
        time.sleep(max(start - time.monotonic(), 0))
        while time.monotonic() < end:
            op(store, key)
            n += 1
        counts[i] = n

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts)


def main(argv: list[str]) -> None:
    assert argv[0] == "--clients", argv
    n = int(argv[1])
    servers = {}
    for spec in argv[2:]:
        name, _, port = spec.partition("=")
        servers[name] = [dist.TCPStore("127.0.0.1", int(port), is_master=False, timeout=timedelta(seconds=60)) for _ in range(n)]
        for i, store in enumerate(servers[name]):
            store.set(f"k{i}", VALUE)  # the key that wait/check/get find
        servers[name][0].set("lat", VALUE)
    print("READY", flush=True)
    for line in sys.stdin:
        words = line.split()
        if words[0] == "LAT":
            print(json.dumps(latency({name: servers[name][0] for name in words[3:]}, OPS[words[1]], int(words[2]))), flush=True)
        elif words[0] == "GO":
            ops = throughput(servers[words[1]], OPS[words[2]], float(words[3]), float(words[4]))
            print(json.dumps({"ops": ops, "threads": n}), flush=True)


main(sys.argv[1:])
