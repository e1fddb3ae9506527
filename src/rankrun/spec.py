"""The launch specification: frozen dataclasses plus the pure parsers that build them.

Everything here is a pure function of its arguments: no ``os.environ``, no argv, no I/O
except where a parser is explicitly handed a probe (GPU counting lives in ``devices``).
``rankrun.cli`` is the only caller that turns user input into these objects; the agent and what it calls take
the whole ``LaunchSpec`` or a part of it, and never change it.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import field
from enum import Enum
from pathlib import Path
from typing import Any

from rankrun.errors import UsageError
from rankrun.record import record

KNOWN_BACKENDS = ("static", "c10d", "etcd", "etcd-v2")
ETCD_DEFAULT_PORT = 2379
DEFAULT_ETCD_PREFIX = "/rankrun"
DEFAULT_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
API_WORKER = "rankrun.api.worker"  # the module each worker of rankrun.launch(fn) runs
API_DIR = "RANKRUN_API_DIR"  # in the launcher's environment: rankrun.launch's caller's private directory
API_DIR_PREFIX = "rankrun-launch-"  # that directory's name starts so (tempfile's prefix)


def api_dir(env: Mapping[str, str]) -> str | None:
    """The private directory (payload, results, report) of the ``rankrun.launch`` caller that started this launcher,
    for the launcher's watchdog to remove if the launcher dies without cleaning up: it dies with its caller, and a
    caller ended by a signal (SIGTERM) runs no clean-up of its own. None when there is none, or when the value does not
    name a directory the API made (``API_DIR_PREFIX``): never anyone else's (pure)."""
    path = env.get(API_DIR, "")
    return path if Path(path).name.startswith(API_DIR_PREFIX) and Path(path).is_absolute() else None
DEFAULT_PREFIX_TEMPLATE = "[${role_name}${rank}]:"


class EntryKind(Enum):
    """How the worker command is built from the training script."""

    SCRIPT = "script"  # python -u script args
    MODULE = "module"  # python -u -m module args
    BINARY = "binary"  # script args  (--no-python)
    RUN_PATH = "run_path"  # python -u -m rankrun.run_path script args  (--run-path)


class Stream(Enum):
    """The bits of torchrun's ``-r``/``-t`` values: 1 = stdout, 2 = stderr, 3 = both."""

    NONE = 0
    STDOUT = 1
    STDERR = 2
    BOTH = 3

    def has_stdout(self) -> bool:
        return bool(self.value & 1)

    def has_stderr(self) -> bool:
        return bool(self.value & 2)


@record
class EntrySpec:
    """What each worker runs."""

    kind: EntryKind
    script: str
    args: tuple[str, ...]
    python: str  # interpreter for SCRIPT / MODULE / RUN_PATH
    local_rank_arg: bool = False  # torch.distributed.launch without --use-env: --local-rank=N after the script

    @property
    def title(self) -> str:
        """The name used in failure reports, as torchrun titles them, but the script's for ``--run-path`` too (torchrun
        says ``run_script_path``, its shim's name); a ``rankrun.launch(fn)`` job's, after ``fn`` (the API passes its
        name as the worker module's third argument)."""
        if self.kind is EntryKind.MODULE and self.script == API_WORKER and len(self.args) > 2:
            return f"rankrun.launch({self.args[2]})"
        return self.script

    @property
    def api_results(self) -> Path | None:
        """A ``rankrun.launch(fn)`` job's results directory (the worker module's second argument), else None."""
        return Path(self.args[1]) if self.kind is EntryKind.MODULE and self.script == API_WORKER and len(self.args) > 1 \
            else None


@record
class RendezvousConf:
    """``--rdzv-conf``, typed: torchrun's keys and defaults (c10d / static / etcd, the etcd ones spelled as
    torchrun's etcd backends spell them), plus rankrun's ``secret_file`` (the embedded store's per-job secret).
    Three are accepted, so that torchrun's command lines work, and used for nothing: ``heartbeat_timeout`` (liveness
    follows ``keep_alive_interval`` and ``keep_alive_max_attempt``), ``store_type`` and ``timeout``."""

    join_timeout: float = 600.0
    last_call_timeout: float = 30.0
    close_timeout: float = 30.0
    heartbeat_timeout: float = 5.0
    keep_alive_interval: float = 5.0
    keep_alive_max_attempt: int = 3
    read_timeout: float = 60.0
    is_host: bool | None = None  # None: inferred from the endpoint's address
    # the embedded store: nodes per rendezvous relay (0: none; None: auto, when the host cannot hold every node)
    relay_group: int | None = None
    store_type: str = "tcp"
    timeout: float | None = None  # the static backend's store timeout (torchrun: 600 s when absent)
    rank: int | None = None  # static only; --node-rank otherwise
    secret_file: Path | None = None  # the per-job secret, read at start (never on argv)
    etcd_prefix: str | None = None
    protocol: str = "http"
    ca_cert: Path | None = None
    ssl_cert: Path | None = None
    ssl_cert_key: Path | None = None
    user: str | None = None
    password_file: Path | None = None


@record
class Endpoint:
    """One etcd member's client URL."""

    scheme: str  # "http" or "https"
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


@record
class Standalone:
    """One node with its own store on an OS-chosen port (``--standalone``, or no rendezvous options)."""

    run_id: str
    conf: RendezvousConf = RendezvousConf()
    min_nodes: int = 1
    max_nodes: int = 1


@record
class StaticRendezvous:
    """``--nnodes N --node-rank R --master-addr A --master-port P`` (the static backend)."""

    run_id: str
    nodes: int
    node_rank: int
    master_addr: str
    master_port: int
    conf: RendezvousConf = RendezvousConf()

    @property
    def min_nodes(self) -> int:
        return self.nodes

    @property
    def max_nodes(self) -> int:
        return self.nodes


@record
class DynamicRendezvous:
    """``--rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id ID --nnodes MIN:MAX``."""

    backend: str  # "c10d" or "etcd"
    endpoint_host: str
    endpoint_port: int
    run_id: str
    min_nodes: int
    max_nodes: int
    conf: RendezvousConf = RendezvousConf()
    etcd_endpoints: tuple[Endpoint, ...] = ()  # etcd: every member given in --rdzv-endpoint, in order

    @property
    def prefix(self) -> str:
        """Where this job's keys live in a shared store (etcd: ``etcd_prefix``, default ``/rankrun``)."""
        return (self.conf.etcd_prefix or DEFAULT_ETCD_PREFIX).rstrip("/")


RendezvousSpec = Standalone | StaticRendezvous | DynamicRendezvous


def on_etcd(rdzv: RendezvousSpec) -> bool:
    """Whether the job meets in etcd (``--rdzv-backend etcd``) rather than a store one of its agents hosts."""
    return isinstance(rdzv, DynamicRendezvous) and rdzv.backend == "etcd"


@record
class StoreSpec:
    """Where the worker store (the one env:// connects to) listens."""

    host: str  # address the store binds and MASTER_ADDR advertises
    port: int  # 0 = let the OS choose, once, and hold it
    relays: bool | None = None  # --store-relays: each node's agent relays its workers' connections (None: when the
    # host cannot hold one connection per rank, ``fdlimit.relays_wanted``)


@record
class RestartPolicy:
    max_restarts: int
    shutdown_timeout: float  # seconds between the polite signal and SIGKILL
    max_node_failures: int = 2  # several nodes: a node blamed for this many of the job's failures is excluded (0: never)


@record
class LogSpec:
    """Console and per-rank file behaviour (torchrun's -r/-t/--log-dir/--local-ranks-filter)."""

    log_dir: Path | None  # None: no user log dir; Path("/dev/null"): no files at all
    redirects: tuple[Stream, ...]  # per local rank
    tee: tuple[Stream, ...]  # per local rank
    local_ranks_filter: frozenset[int] | None  # None: every rank reaches the console
    prefix_template: str | None  # None: raw with one rank on the console, DEFAULT_PREFIX_TEMPLATE with several
    stdout_filters: tuple[str, ...] = ()
    stderr_filters: tuple[str, ...] = ()

    @property
    def discard_files(self) -> bool:
        return self.log_dir is not None and str(self.log_dir) == "/dev/null"

    def wants_files(self) -> bool:
        return any(s is not Stream.NONE for s in self.redirects + self.tee)


@record
class HangSpec:
    """``--hang-timeout`` / ``--hang-action``: when a silent job is reported as stalled, and what follows."""

    timeout: float = 0.0  # seconds without output (and with unchanged stacks); 0: never
    action: str = "report"  # "report": keep running; "fail": stop the group, as after a failure


@record
class HealthSpec:
    """``--health-check CMD`` / ``--health-check-timeout``: the command a node runs before each round it joins;
    ``--network-check``: the round's nodes measure their ring neighbours before the workers start."""

    check: str | None = None  # run with /bin/sh -c; None: no check
    timeout: float = 60.0  # seconds before the check (its whole process group) is killed and the node unhealthy
    network: bool = False  # --network-check (rendezvous.netcheck)


@record
class StragglerSpec:
    """``--straggler-window`` / ``--straggler-action``: how often the launcher judges which rank the others wait for,
    and what a persistent straggler leads to."""

    window: float = 60.0  # seconds a verdict covers; 0: no watch (no Flight Recorder arrivals, no side thread)
    action: str = "report"  # "report": a line; "exclude": a persistent straggler counts as its node's blame


@record
class ObserveSpec:
    """Who consumes the job's events: ``--events``, ``--metrics-port``, torchelastic's own lines on stderr
    (``--event-log-handler console``) and dcgm-exporter's GPU-to-job files (``DCGM_HPC_JOB_MAPPING_DIR``)."""

    events: str | None = None  # a file, a FIFO or /dev/stderr; None: no events file
    metrics_port: int | None = None  # 0: the OS picks; None: no endpoint
    torchelastic: bool = False  # --event-log-handler console
    dcgm_dir: str | None = None  # DCGM_HPC_JOB_MAPPING_DIR; None: no files
    dcgm_gpus: tuple[str | None, ...] = ()  # each local rank's GPU as DCGM numbers it (None: no file for it)


@record
class CheckpointSpec:
    """Kept progress (``rankrun.checkpoint``): ``--checkpoint-dir``, where every complete kept step is also written in
    the background (``DIR/<run id>/step_<S>/``; ``DIR`` itself when the run id is ``none``)."""

    dir: Path | None = None  # absolute, created and found writable by the CLI; None: memory (and neighbour) only


@record
class WorkerSpec:
    nproc: int
    role: str
    virtual_local_rank: bool
    entry: EntrySpec
    cpus: tuple[frozenset[int], ...] = ()  # --numa-binding: the CPUs of each local rank; (): no binding
    preload: tuple[str, ...] = ()  # --preload: the modules imported once per node, every worker forked from them


@record
class LaunchSpec:
    """Everything the agent needs, parsed once at the edge."""

    worker: WorkerSpec
    rendezvous: RendezvousSpec
    store: StoreSpec
    restart: RestartPolicy
    logs: LogSpec
    signals: tuple[int, ...]
    signals_text: str
    base_env: dict[str, str] = field(repr=False, compare=False)
    local_addr: str | None = None  # --local-addr: this node's address for the other nodes
    secret: bytes | None = field(default=None, repr=False)  # the job's rendezvous secret (never from argv)
    etcd_password: str | None = field(default=None, repr=False)  # --rdzv-conf password_file's content
    hang: HangSpec = HangSpec()
    observe: ObserveSpec = ObserveSpec()
    health: HealthSpec = HealthSpec()
    straggler: StragglerSpec = StragglerSpec()
    checkpoint: CheckpointSpec = CheckpointSpec()

    @property
    def multi_node(self) -> bool:
        """Whether nodes meet through a rendezvous (etcd: always, even for one node: the store is the point)."""
        rdzv = self.rendezvous
        if on_etcd(rdzv):
            return True
        return not isinstance(rdzv, Standalone) and rdzv.max_nodes > 1


# --------------------------------------------------------------------------- parsers


def parse_nnodes(value: str) -> tuple[int, int]:
    """``"N"`` or ``"MIN:MAX"`` with ``0 < MIN <= MAX``."""
    parts = value.split(":")
    if len(parts) > 2:
        raise UsageError("--nnodes", value, 'expected N or "MIN:MAX"')
    try:
        nums = [int(p) for p in parts]
    except ValueError:
        raise UsageError("--nnodes", value, 'expected N or "MIN:MAX" with integers') from None
    lo, hi = nums[0], nums[-1]
    if lo <= 0 or hi < lo:
        raise UsageError("--nnodes", value, "need 0 < MIN <= MAX")
    return lo, hi


def parse_nproc(value: str, *, cpu_count: int, gpu_count: int | None) -> int:
    """An integer, ``cpu``, ``gpu`` or ``auto``; ``gpu_count`` is ``None`` when no probe ran."""
    if value == "cpu":
        return cpu_count
    if value == "gpu":
        if not gpu_count:
            where = "CUDA_VISIBLE_DEVICES, /proc/driver/nvidia, nvidia-smi"
            raise UsageError("--nproc-per-node", value, f"no NVIDIA GPU found ({where})")
        return gpu_count
    if value == "auto":
        return gpu_count or cpu_count
    try:
        n = int(value)
    except ValueError:
        raise UsageError("--nproc-per-node", value, "expected a positive integer, 'cpu', 'gpu' or 'auto'") from None
    if n <= 0:
        raise UsageError("--nproc-per-node", value, "must be at least 1")
    return n


_STD_ALL = re.compile(r"^[0-3]$")
_STD_MAP = re.compile(r"^(\d+:[0-3],)*(\d+:[0-3])$")


def parse_std_map(flag: str, value: str, nproc: int) -> tuple[Stream, ...]:
    """torchrun's ``-r``/``-t`` syntax: ``0..3`` for every rank, or ``lr:v,lr:v``."""
    value = value.strip()
    if _STD_ALL.match(value):
        return (Stream(int(value)),) * nproc
    if not _STD_MAP.match(value):
        raise UsageError(flag, value, "expected 0-3 or a map like 0:3,1:1")
    per_rank = [Stream.NONE] * nproc
    for item in value.split(","):
        rank_text, bits = item.split(":")
        rank = int(rank_text)
        if rank >= nproc:
            raise UsageError(flag, value, f"local rank {rank} does not exist with {nproc} process(es) per node")
        per_rank[rank] = Stream(int(bits))
    return tuple(per_rank)


def parse_ranks_filter(value: str) -> frozenset[int] | None:
    if not value.strip():
        return None
    try:
        ranks = frozenset(int(v) for v in value.split(","))
    except ValueError:
        raise UsageError("--local-ranks-filter", value, "expected a comma-separated list of integers") from None
    if min(ranks) < 0:  # no node has it: a filter that can never match is a mistake, not a quiet console
        raise UsageError("--local-ranks-filter", value, "local ranks are 0 or more")
    return ranks


def _seconds(value: str) -> float:
    number = float(value)
    if not number > 0:
        raise ValueError("must be greater than 0")
    return number


def _count(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError("must be at least 1")
    return number


def _relay_group(value: str) -> int:
    number = int(value)
    if number < 0:
        raise ValueError("must be 0 (no relays) or more")
    return number


_TRUE, _FALSE = ("1", "true", "t", "yes", "y"), ("0", "false", "f", "no", "n")


def _bool(value: str) -> bool:
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError("expected 1/0, true/false, yes/no")


def _rank(value: str) -> int:
    number = int(value)
    if number < 0:
        raise ValueError("must be 0 or more")
    return number


def _store_type(value: str) -> str:
    if value not in ("tcp", "file"):
        raise ValueError("expected tcp or file")
    return value


def _protocol(value: str) -> str:
    if value not in ("http", "https"):
        raise ValueError("expected http or https")
    return value


_CONF_KEYS: dict[str, tuple[str, Callable[[str], object]]] = {
    "join_timeout": ("join_timeout", _seconds),
    "last_call_timeout": ("last_call_timeout", _seconds),
    "close_timeout": ("close_timeout", _seconds),
    "heartbeat_timeout": ("heartbeat_timeout", _seconds),
    "keep_alive_interval": ("keep_alive_interval", _seconds),
    "keep_alive_max_attempt": ("keep_alive_max_attempt", _count),
    "read_timeout": ("read_timeout", _seconds),
    "is_host": ("is_host", _bool),
    "relay_group": ("relay_group", _relay_group),
    "store_type": ("store_type", _store_type),
    "timeout": ("timeout", _seconds),
    "rank": ("rank", _rank),
    "secret_file": ("secret_file", Path),
    "etcd_prefix": ("etcd_prefix", str),
    "protocol": ("protocol", _protocol),
    "ca_cert": ("ca_cert", Path),
    "cacert": ("ca_cert", Path),  # the legacy etcd backend's spellings
    "ssl_cert": ("ssl_cert", Path),
    "cert": ("ssl_cert", Path),
    "ssl_cert_key": ("ssl_cert_key", Path),
    "key": ("ssl_cert_key", Path),
    "user": ("user", str),
    "password_file": ("password_file", Path),
}


def unquote(text: str) -> str:
    """``text`` without one pair of matching surrounding quotes: a caller without a shell (a Kubernetes manifest,
    a subprocess list) passes ``'k=v'`` with its quotes, which torchrun tolerates."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1].strip()
    return text


def parse_rdzv_conf(value: str) -> tuple[RendezvousConf, tuple[str, ...]]:
    """``k1=v1,k2=v2`` → typed settings, and the keys it did not know (ignored, as torchrun does; the caller
    warns). Blanks around keys and values are dropped, and one pair of surrounding quotes around the whole
    value or around a value (``unquote``). A secret is never taken from the command line (it would show in
    ``ps``): ``secret_file=`` or ``RANKRUN_RDZV_SECRET``.
    """
    fields: dict[str, Any] = {}
    unknown: list[str] = []
    for item in unquote(value).split(","):
        if not item.strip():
            continue
        key, sep, val = item.partition("=")
        key, val = key.strip(), unquote(val)
        if key in ("secret", "password"):
            shown = f"{key}=<hidden>"
            raise UsageError("--rdzv-conf", shown, f"never put a {key} on the command line: use "
                             + ("secret_file=PATH or RANKRUN_RDZV_SECRET" if key == "secret" else "password_file=PATH"))
        if not sep or not key or not val:
            raise UsageError("--rdzv-conf", value, f"{item.strip()!r} is not key=value")
        if key not in _CONF_KEYS:
            unknown.append(key)
            continue
        name, parse = _CONF_KEYS[key]
        try:
            fields[name] = parse(val)
        except ValueError as exc:
            why = str(exc) if str(exc).startswith(("must", "expected")) else "expected a number"  # int()/float()'s own
            raise UsageError("--rdzv-conf", f"{key}={val}", why) from None
    return RendezvousConf(**fields), tuple(unknown)


DEFAULT_RUN_ID = "none"  # torchrun's --rdzv-id default: the run id of a static job that names none


def rendezvous_name(run_id: str) -> str:
    """How a line names the job's rendezvous: by its run id, unless that is torchrun's default, which reads as if
    there were no rendezvous (``rendezvous none: no secret``)."""
    return "rendezvous" if run_id == DEFAULT_RUN_ID else f"rendezvous {run_id}"


def unused_id_note(given: str, run_id: str, *, explicit: bool) -> str | None:
    """The line for an ``--rdzv-id`` that a standalone run (``explicit``: ``--standalone``) does not use. torchrun
    gives every standalone run a fresh id whatever ``--rdzv-id`` says (its ``run.run``), silently; the workers' id
    stays torchrun's, and a user who named the job is told the id it runs as, and how to keep theirs."""
    if given in ("", DEFAULT_RUN_ID):  # no id, or torchrun's default: nothing of the user's is dropped
        return None
    why = "--standalone" if explicit else "one node without --rdzv-endpoint or --master-port runs standalone, which"
    keep = "drop --standalone and add" if explicit else "add"
    return (f"rankrun: note: --rdzv-id {given} is not used: {why} gives each run a fresh id, as torchrun does; the "
            f"workers' TORCHELASTIC_RUN_ID, the events, the metrics and the DCGM files name {run_id}; to run as {given}, "
            f"{keep} --rdzv-backend c10d --rdzv-endpoint localhost:0")


def unknown_conf_note(keys: Sequence[str]) -> str:
    """The warning for ``--rdzv-conf`` keys nobody reads (torchrun is silent; a typo should still be seen)."""
    names = ", ".join(repr(k) for k in keys)
    return (f"rankrun: warning: --rdzv-conf: unknown key{'s' if len(keys) > 1 else ''} {names} ignored "
            f"(accepted: {', '.join(sorted(_CONF_KEYS))})")


def _host_port(value: str) -> tuple[str, str]:
    """``host``, ``host:port`` or ``[v6]:port`` → host and the port's text (empty when absent)."""
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        return host, rest[1:] if rest.startswith(":") else rest
    if value.count(":") == 1:
        host, port_text = value.split(":")
        return host, port_text
    return value, ""


def parse_endpoint(value: str, default_port: int) -> tuple[str, int]:
    """``host[:port]`` or ``[v6]:port``; the port must be 0-65535."""
    value = value.strip()
    host, port_text = _host_port(value)
    if not host:
        raise UsageError("--rdzv-endpoint", value, "missing host")
    if not port_text:
        return host, default_port
    if not port_text.isdigit() or int(port_text) > 65535:
        raise UsageError("--rdzv-endpoint", value, "port must be a number from 0 to 65535")
    return host, int(port_text)


def parse_signals(value: str) -> tuple[int, ...]:
    sigs: list[int] = []
    for name in (v.strip() for v in value.split(",")):
        if not name:
            continue
        try:
            sig = signal.Signals[name]
        except KeyError:
            raise UsageError("--signals-to-handle", value, f"unknown signal {name!r}") from None
        if sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
            raise UsageError("--signals-to-handle", value, f"{name} cannot be handled")
        sigs.append(int(sig))
    return tuple(dict.fromkeys(sigs))


def parse_filters(value: str) -> tuple[str, ...]:
    """Comma list where ``,,`` stands for a literal comma."""
    if not value:
        return ()
    marker = "\x00"
    return tuple(p.replace(marker, ",") for p in value.replace(",,", marker).split(",") if p)


def uuid4_from(raw: bytes) -> str:
    """An RFC 4122 version-4 UUID string from 16 random bytes (``uuid`` costs ~5 ms of start-up to import)."""
    b = bytearray(raw)
    b[6] = (b[6] & 0x0F) | 0x40
    b[8] = (b[8] & 0x3F) | 0x80
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def check_port(flag: str, port: int) -> int:
    if not 0 <= port <= 65535:
        raise UsageError(flag, port, "must be from 0 to 65535")
    return port


def resolve_backend(backend: str) -> str:
    """The backend's canonical name: ``etcd-v2`` is an alias of ``etcd`` (rankrun speaks etcd's v3 API)."""
    if backend not in KNOWN_BACKENDS:
        raise UsageError("--rdzv-backend", backend, f"unknown rendezvous backend (known: {', '.join(KNOWN_BACKENDS)})")
    return "etcd" if backend.startswith("etcd") else backend


ETCD_V2_NOTE = ("rankrun: note: --rdzv-backend etcd-v2 uses etcd's v3 API (etcd 3.4 or newer; "
                "the v2 API is gone from etcd 3.6)")


def parse_etcd_endpoints(value: str, protocol: str = "http") -> tuple[Endpoint, ...]:
    """``host:port,host:port`` or ``https://host:port,...`` (``--rdzv-endpoint``); the port defaults to 2379."""
    found: list[Endpoint] = []
    for item in (v.strip() for v in value.split(",")):
        if not item:
            continue
        scheme, sep, rest = item.partition("://")
        if not sep:
            scheme, rest = protocol, item
        if scheme not in ("http", "https"):
            raise UsageError("--rdzv-endpoint", item, "the scheme must be http:// or https://")
        host, port_text = _host_port(rest.rstrip("/"))
        if not host:
            raise UsageError("--rdzv-endpoint", item, "missing host")
        if port_text and (not port_text.isdigit() or not 0 < int(port_text) <= 65535):
            raise UsageError("--rdzv-endpoint", item, "port must be a number from 1 to 65535")
        found.append(Endpoint(scheme, host, int(port_text) if port_text else ETCD_DEFAULT_PORT))
    if not found:
        raise UsageError("--rdzv-endpoint", value, "the etcd backend needs at least one host:port")
    return tuple(dict.fromkeys(found))
