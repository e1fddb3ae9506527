"""argv + environment → ``LaunchSpec``, handed to ``rankrun.main.launch``, whose exit code is the process's.

Of the launch, this is the module that reads ``sys.argv`` and ``os.environ`` (the few others, which must act before
a spec exists, are listed in ``tests/unit/test_claims.py``). It accepts every
torchrun 2.13 option in both spellings with torchrun's defaults and ``PET_*``
environment defaults, validates everything up front, and turns every user mistake into
one line on stderr (``rankrun: error: <flag> <value>: <reason>``) with the error's exit code (2). Errors raised once the
job runs are ``rankrun.main``'s to map. Before the console exists, this module prints its own few lines to stderr (the
Slurm shape, ``--rdzv-conf`` notes, the legacy note, usage errors) and ``rankrun --stacks``'s answer to stdout.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NoReturn

from rankrun import __version__, devices, slurm
from rankrun.errors import EXIT_SUCCESS, ArgumentError, NotSupportedYetError, RankrunError, UsageError
from rankrun.fsutil import which
from rankrun.proc.early import EarlyCatcher
from rankrun.spec import (
    DEFAULT_PREFIX_TEMPLATE,
    DEFAULT_RUN_ID,
    DEFAULT_SIGNALS,
    ETCD_V2_NOTE,
    CheckpointSpec,
    DynamicRendezvous,
    EntryKind,
    EntrySpec,
    HangSpec,
    HealthSpec,
    LaunchSpec,
    LogSpec,
    ObserveSpec,
    RendezvousConf,
    RendezvousSpec,
    RestartPolicy,
    Standalone,
    StaticRendezvous,
    StoreSpec,
    StragglerSpec,
    WorkerSpec,
    check_port,
    parse_endpoint,
    parse_etcd_endpoints,
    parse_filters,
    parse_nnodes,
    parse_nproc,
    parse_ranks_filter,
    parse_rdzv_conf,
    parse_signals,
    parse_std_map,
    resolve_backend,
    unknown_conf_note,
    unused_id_note,
    uuid4_from,
)

C10D_DEFAULT_PORT = 29400
STATIC_DEFAULT_PORT = 29500


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        if "training_script" in message and "required" in message:
            raise _NoScript(f"missing training script (usage: {self.prog} [options] SCRIPT [ARGS...])")
        raise ArgumentError(message)


class _NoScript(ArgumentError):
    """No training script on the command line."""


class _Formatter(argparse.HelpFormatter):
    """The default formatter at the terminal's width, measured without ``shutil``: argparse builds one
    formatter per ``add_argument`` (to check each metavar), and its default width pulls in ``shutil``
    (with ``zlib``, ``bz2``, ``lzma``) and asks the terminal every time: ~2 ms of every launch."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=_columns() - 2)

    def _format_action_invocation(self, action: argparse.Action) -> str:
        """One spelling of each multi-word option (``--nproc-per-node N``, not ``..., --nproc_per_node N`` too): the
        description says the other works; the list stays half as long."""
        shown = _shown_spellings(action.option_strings)
        if shown == action.option_strings:
            return super()._format_action_invocation(action)
        one = argparse.Action(shown, action.dest, nargs=action.nargs, metavar=action.metavar, choices=action.choices)
        return super()._format_action_invocation(one)


def _shown_spellings(names: Sequence[str]) -> list[str]:
    """The option's spellings but torchrun's underscore twin of one already there (``--nproc_per_node``)."""
    return [n for n in names if not ("_" in n and n.replace("_", "-") in names)]


def _columns() -> int:
    """``shutil.get_terminal_size().columns``: ``COLUMNS``, else the terminal on stdout, else 80."""
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        columns = 0
    if columns > 0:
        return columns
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return 80


# (spellings, PET name or None, argparse kwargs). Multi-word options get both spellings, as in torchrun.
_OPTIONS: list[tuple[tuple[str, ...], str | None, dict[str, object]]] = [
    (("--nnodes",), "NNODES",
     {"metavar": "N|MIN:MAX", "default": "1:1", "help": "number of nodes, N or MIN:MAX (elastic, with --rdzv-backend c10d)"}),
    (("--nproc-per-node", "--nproc_per_node"), "NPROC_PER_NODE",
     {"metavar": "N", "default": "1", "help": "workers per node: an integer, cpu, gpu or auto"}),
    (("--rdzv-backend", "--rdzv_backend"), "RDZV_BACKEND",
     {"metavar": "NAME", "default": "static", "help": "static, c10d or etcd (etcd-v2: an alias)"}),
    (("--rdzv-endpoint", "--rdzv_endpoint"), "RDZV_ENDPOINT",
     {"metavar": "HOST:PORT", "default": "", "help": "HOST[:PORT] (etcd: a list)"}),
    (("--rdzv-id", "--rdzv_id"), "RDZV_ID", {"metavar": "ID", "default": DEFAULT_RUN_ID,
     "help": "job id, becomes TORCHELASTIC_RUN_ID (a standalone run, as torchrun's, gets a fresh one instead)"}),
    (("--rdzv-conf", "--rdzv_conf"), "RDZV_CONF",
     {"metavar": "K=V,...", "default": "", "help": "k1=v1,k2=v2 rendezvous settings"}),
    (("--max-restarts", "--max_restarts"), "MAX_RESTARTS",
     {"metavar": "N", "default": 0, "type": int, "help": "restarts of the worker group after a failure (default 0)"}),
    (("--max-node-failures", "--max_node_failures"), "MAX_NODE_FAILURES",
     {"default": "2", "metavar": "K", "help": "several nodes: exclude a node from the job once it has been blamed for K "
      "failures (its workers failed first); it exits 4 (default 2, 0: never)"}),
    (("--monitor-interval", "--monitor_interval"), "MONITOR_INTERVAL",
     {"metavar": "SECONDS", "default": 0.1, "type": float, "help": "accepted for compatibility; exits are events, not polled"}),
    (("--start-method", "--start_method"), "START_METHOD",
     {"default": "spawn", "choices": ["spawn", "fork", "forkserver"], "help": "accepted for compatibility"}),
    (("--event-log-handler", "--event_log_handler"), "EVENT_LOG_HANDLER",
     {"metavar": "NAME", "default": "null", "help": "accepted for compatibility: null, console or dynamic_rendezvous"}),
    (("--role",), "ROLE", {"metavar": "NAME", "default": "default", "help": "worker role: ROLE_NAME and the console prefix"}),
    (("--log-dir", "--log_dir"), "LOG_DIR",
     {"metavar": "DIR", "default": None, "help": "keep per-rank logs in DIR/<run_id>_<rand>/attempt_<n>/<local_rank>/"}),
    (("-r", "--redirects"), "REDIRECTS",
     {"metavar": "MAP", "default": "0", "help": "send output to files only: 0-3 (1 stdout, 2 stderr, 3 both) or a map 0:3,1:1"}),
    (("-t", "--tee"), "TEE",
     {"metavar": "MAP", "default": "0", "help": "write output to files and the console: same syntax as -r"}),
    (("--local-ranks-filter", "--local_ranks_filter"), "LOCAL_RANKS_FILTER",
     {"metavar": "RANKS", "default": "", "help": "only these local ranks (comma list) reach the console"}),
    (("--duplicate-stdout-filters", "--duplicate_stdout_filters"), "DUPLICATE_STDOUT_FILTERS",
     {"metavar": "WORDS", "default": "",
      "help": "tee'd stdout lines containing any of these (comma list) also go to filtered_stdout.log"}),
    (("--duplicate-stderr-filters", "--duplicate_stderr_filters"), "DUPLICATE_STDERR_FILTERS",
     {"metavar": "WORDS", "default": "", "help": "the same for stderr and filtered_stderr.log"}),
    (("--node-rank", "--node_rank"), "NODE_RANK",
     {"metavar": "N", "default": 0, "type": int, "help": "this node's rank (static backend)"}),
    (("--master-addr", "--master_addr"), "MASTER_ADDR",
     {"metavar": "ADDR", "default": "127.0.0.1", "help": "address the worker store binds and MASTER_ADDR (static backend)"}),
    (("--master-port", "--master_port"), "MASTER_PORT",
     {"metavar": "PORT", "default": None, "type": int,
      "help": "port of the worker store (static backend; 0 lets the OS choose)"}),
    (("--store-relays", "--store_relays"), "STORE_RELAYS",
     {"default": "auto", "nargs": "?", "const": "1", "metavar": "auto|1|0",
      "help": "several nodes: each node's agent serves its own workers' store connections and forwards them to the "
      "host over one connection (MASTER_ADDR names it); auto (the default): when the host cannot hold one connection "
      "per rank"}),
    (("--local-addr", "--local_addr"), "LOCAL_ADDR",
     {"metavar": "ADDR", "default": None, "help": "this node's address (default 127.0.0.1)"}),
    (("--logs-specs", "--logs_specs"), None,
     {"metavar": "NAME", "default": None, "help": "only 'default' (torchrun's own layout)"}),
    (("--numa-binding", "--numa_binding"), None,
     {"default": None, "choices": ["node", "socket", "exclusive", "core-complex"],
      "help": "bind each local rank to CPUs near its GPU: node, socket, exclusive or core-complex"}),
    (("--preload",), "PRELOAD",
     {"default": "", "metavar": "MODULES", "help": "import MODULES (comma list, e.g. torch) once per node and fork "
      "every Python worker of every attempt from that process: a restart does not import them again"}),
    (("--checkpoint-dir", "--checkpoint_dir"), "CHECKPOINT_DIR",
     {"metavar": "DIR", "default": None, "help": "also write every complete step that rankrun.checkpoint keeps to "
      "DIR/<run id>/, in the background (the newest two), and the newest one on a stop by signal; a later job with "
      "the same DIR and --rdzv-id resumes from it"}),
    (("--signals-to-handle", "--signals_to_handle"), "SIGNALS_TO_HANDLE",
     {"metavar": "SIGNALS", "default": DEFAULT_SIGNALS, "help": f"signals forwarded to the workers (default {DEFAULT_SIGNALS})"}),
    (("--shutdown-timeout", "--shutdown_timeout"), "SHUTDOWN_TIMEOUT",
     {"metavar": "SECONDS", "default": None, "type": int, "help": "seconds between the polite signal and SIGKILL (default 30)"}),
    (("--hang-timeout", "--hang_timeout"), "HANG_TIMEOUT",
     {"metavar": "SECONDS", "default": "0",
      "help": "report the job as stalled after SECONDS without output and with every worker's stacks "
      "unchanged (0: off)"}),
    (("--stacks",), None, {"default": None, "metavar": "PID",
                           "help": "rankrun --stacks [PID]: print the grouped stacks of a running job and exit"}),
    (("--hang-action", "--hang_action"), "HANG_ACTION",
     {"metavar": "ACTION", "default": "report",
      "help": "after a stall report: report (keep running) or fail (stop the workers as after a "
      "failure: --max-restarts applies)"}),
    (("--straggler-window", "--straggler_window"), "STRAGGLER_WINDOW",
     {"default": "60", "metavar": "SECONDS", "help": "every SECONDS, name a rank the others keep waiting for in "
      "their collectives (default 60, 0: off)"}),
    (("--straggler-action", "--straggler_action"), "STRAGGLER_ACTION",
     {"metavar": "ACTION", "default": "report",
      "help": "after a straggler verdict: report (a line) or exclude (a rank that stays the "
      "straggler counts as its node's blame for --max-node-failures)"}),
    (("--health-check", "--health_check"), "HEALTH_CHECK",
     {"default": None, "metavar": "CMD", "help": "run CMD (/bin/sh -c) on every node before each round; a non-zero exit "
      "or a timeout makes the node unhealthy: excluded from the job, exit 4"}),
    (("--health-check-timeout", "--health_check_timeout"), "HEALTH_CHECK_TIMEOUT",
     {"default": "60", "metavar": "SECONDS", "help": "kill a --health-check still running after SECONDS (default 60)"}),
    (("--events",), "EVENTS", {"default": None, "metavar": "PATH",
                               "help": "append the job's events as JSON lines to PATH (a file, a FIFO, /dev/stderr)"}),
    (("--metrics-port",), "METRICS_PORT", {"default": None, "metavar": "PORT",
                                           "help": "serve Prometheus metrics at http://ADDR:PORT/metrics on this node's "
                                           "address (0: the OS picks)"}),
    (("--log-line-prefix-template", "--log_line_prefix_template"), None,
     {"metavar": "TEMPLATE", "default": None,
      "help": "console prefix, a string.Template with ${rank}, ${local_rank}, ${role_name}; '' for none "
      f"(default $TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, else none with one rank on the console and {DEFAULT_PREFIX_TEMPLATE!r} "
      "with several)"}),
]
_FLAGS: list[tuple[tuple[str, ...], str, str]] = [
    (("--standalone",), "STANDALONE", "single-node job with its own store on a free port"),
    (("-m", "--module"), "MODULE", "run the script as a module: python -u -m SCRIPT"),
    (("--no-python", "--no_python"), "NO_PYTHON", "run SCRIPT as a program, not with python"),
    (("--run-path", "--run_path"), "RUN_PATH", "run the script with runpy.run_path (exceptions recorded like @record)"),
    (("--virtual-local-rank", "--virtual_local_rank"), "VIRTUAL_LOCAL_RANK",
     "LOCAL_RANK=0 for every worker, each with its own CUDA_VISIBLE_DEVICES entry"),
    (("--network-check", "--network_check"), "NETWORK_CHECK",
     "several nodes: before each round's workers start, every node measures its ring neighbour; a node whose links "
     "are outliers is excluded from the job, exit 4"),
]

# --help's headings, the way a reader looks for an option: (title, description, each option's first spelling). Every
# option is under exactly one (build_parser fails on one that is not; tests/unit/test_cli_help.py pins them).
GROUPS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("torchrun's options", "what to run, its workers and their output (torchrun's options for several nodes and "
     "restarts are under those headings)",
     ("--nproc-per-node", "--standalone", "-m", "--no-python", "--run-path", "--role", "--virtual-local-rank",
      "--numa-binding", "--log-dir", "-r", "-t", "--local-ranks-filter", "--duplicate-stdout-filters",
      "--duplicate-stderr-filters", "--log-line-prefix-template", "--logs-specs", "--start-method", "--monitor-interval",
      "--event-log-handler", "--use-env")),
    ("several nodes", "how the nodes of one job meet (every node gives the same values)",
     ("--nnodes", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--rdzv-conf", "--node-rank", "--master-addr",
      "--master-port", "--local-addr")),
    ("start-up", "how the workers start", ("--preload",)),
    ("faults and restarts", "what a failure, a signal or a stall does",
     ("--max-restarts", "--max-node-failures", "--signals-to-handle", "--shutdown-timeout", "--checkpoint-dir",
      "--hang-timeout", "--hang-action")),
    ("observing", "the job's events, its metrics and its stacks, while it runs",
     ("--events", "--metrics-port", "--stacks")),
    ("health", "checks that keep a bad node out of the job", ("--health-check", "--health-check-timeout",
                                                            "--network-check")),
    ("stragglers", "the rank the others keep waiting for", ("--straggler-window", "--straggler-action")),
    ("large jobs", "thousands of ranks", ("--store-relays",)),
)


def _env_flag(env: Mapping[str, str], name: str) -> bool:
    value = env.get(f"PET_{name}", "").strip()
    if not value:  # unset, or empty: Kubeflow's PyTorchJob writes PET_STANDALONE="" for elastic jobs
        return False
    try:
        return bool(int(value))
    except ValueError:
        raise UsageError(f"PET_{name}", value, "expected 0 or 1") from None


LEGACY = "python -m rankrun.launch"
LEGACY_NOTE = ("rankrun: note: python -m rankrun.launch keeps torch.distributed.launch's contract: each worker gets "
               "--local-rank=N after the script (none with --use-env); new scripts read LOCAL_RANK and run under rankrun")


def build_parser(env: Mapping[str, str], *, legacy: bool = False) -> argparse.ArgumentParser:
    parser = _Parser(
        prog=LEGACY if legacy else "rankrun",
        usage=f"{LEGACY if legacy else 'rankrun'} [options] SCRIPT [ARGS...]",
        description="Start one worker per slot with torchrun's environment; a drop-in replacement for torchrun. Every "
                    "torchrun option works, in both spellings (--nproc-per-node or --nproc_per_node).",
        epilog="exit codes: 0 success, 1 workers failed, 2 usage error, 3 launcher error, 4 this node was excluded from "
               "the job (drain it), 128+N stopped by signal N",
        formatter_class=_Formatter,
    )
    options = {names[0]: (names, pet, kwargs) for names, pet, kwargs in _OPTIONS}
    flags = {names[0]: (names, pet, text) for names, pet, text in _FLAGS}
    for title, description, firsts in GROUPS:  # each heading's options in its order
        group = parser.add_argument_group(title, description)
        for first in firsts:
            if first in options:
                names, pet, kwargs = options.pop(first)
                opts = dict(kwargs)
                if pet is not None and env.get(f"PET_{pet}", "").strip():  # an empty PET_ variable is an unset one
                    opts["default"] = env[f"PET_{pet}"]
                group.add_argument(*names, **opts)  # type: ignore[arg-type]
            elif first in flags:
                names, flag_pet, text = flags.pop(first)
                group.add_argument(*names, action="store_true", default=_env_flag(env, flag_pet), help=text)
            elif first == "--use-env" and legacy:
                group.add_argument("--use-env", "--use_env", action="store_true", help="LOCAL_RANK in the environment "
                                   "only: no --local-rank=N after the script (also --use-env=1/true/True, which torch "
                                   "refuses)")
    if options or flags:  # an option given no heading would be missing from the parser: fail at once, in every test
        raise AssertionError(f"options under no --help heading: {sorted(options) + sorted(flags)}")
    parser.add_argument("--version", action="version", version=f"rankrun {__version__}")
    parser.add_argument("training_script", help="script, module (-m) or program (--no-python)")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return parser


def parse_args(argv: Sequence[str], env: Mapping[str, str], *, legacy: bool = False) -> argparse.Namespace:
    parser = build_parser(env, legacy=legacy)
    args = _bare_store_relays(list(argv), parser)
    args = _use_env_values(args, parser) if legacy else args
    try:
        ns, unknown = parser.parse_known_args(args)
    except _NoScript:
        # rankrun --hlep: a mistyped option is the likelier mistake; parsed again with a stand-in script to find it
        try:
            unknown = parser.parse_known_args([*args, "SCRIPT"])[1]
        except ArgumentError:
            unknown = []
        if not unknown:
            raise
    if unknown:  # only before the script: what follows it is the script's (argparse.REMAINDER), never rejected
        raise ArgumentError(unknown_options(unknown, list(parser._option_string_actions)))
    return ns


def unknown_options(unknown: Sequence[str], known: Sequence[str]) -> str:
    """argparse's ``unrecognized arguments`` as one line that names each unknown option and, for a mistyped one,
    the closest real spelling (``--nprocs-per-node``: ``--nproc-per-node``)."""
    import difflib  # noqa: PLC0415 - only a mistyped command line pays for it

    said = []
    for arg in unknown:
        name = arg.partition("=")[0]  # --nprocs-per-node=4: the option, not its value
        close = difflib.get_close_matches(name, known)
        said.append(f"{name} (did you mean {close[0]}?)" if close else name)
    plain = "" if any("(" in s for s in said) else " (--help lists the options)"
    return f"unknown option{'s' if len(said) > 1 else ''} {', '.join(said)}{plain}"


_RELAYS_VALUES = ("auto", "1", "0", "true", "false", "yes", "no", "on", "off")


def _bare_store_relays(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """``--store-relays`` alone is ``--store-relays=1``: argparse's optional value would take the script that follows
    (``--store-relays train.py``) as its value. Only among the launcher's options, before the script."""

    def bare(name: str, value: str | None, following: str | None) -> tuple[list[str], int] | None:
        if name not in ("--store-relays", "--store_relays") or value is not None:
            return None
        if following is not None and following.lower() in _RELAYS_VALUES:
            return [f"{name}={following}"], 2
        return [f"{name}=1"], 1

    return _rewrite_options(argv, parser, bare)


def _use_env_values(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """``--use-env=VALUE`` (torch's docs show ``--use-env=True``, which its own parser refuses) as the flag, or
    nothing for a false value; only among the launcher's options, before the script and its arguments."""

    def flag(name: str, value: str | None, _following: str | None) -> tuple[list[str], int] | None:
        if name not in ("--use-env", "--use_env") or value is None:
            return None
        if value.lower() in ("1", "true", "yes"):
            return [name], 1
        if value.lower() in ("0", "false", "no"):
            return [], 1
        raise UsageError(name, value, "expected 1/0, true/false or yes/no (or the flag alone)")

    return _rewrite_options(argv, parser, flag)


_Rewrite = Callable[[str, str | None, str | None], tuple[list[str], int] | None]


def _rewrite_options(argv: list[str], parser: argparse.ArgumentParser, rewrite: _Rewrite) -> list[str]:
    """The launcher's own options (up to the script or ``--``: the rest is the script's), each kept with its value
    unless ``rewrite`` replaces it. ``rewrite`` is given the option's name, its ``=value`` (None without one) and the
    argument after it, and answers what stands instead and how many arguments that took, or None to keep it."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("-") or arg == "--":
            return out + argv[i:]  # the script: the rest is its own
        name, eq, value = arg.partition("=")
        done = rewrite(name, value if eq else None, argv[i + 1] if i + 1 < len(argv) else None)
        if done is not None:
            out += done[0]
            i += done[1]
            continue
        action = parser._option_string_actions.get(name)  # which options take a value
        takes = action is not None and action.nargs != 0 and not eq
        out += argv[i:i + 2] if takes else [arg]
        i += 2 if takes else 1
    return out


# --------------------------------------------------------------------------- spec building


def _entry(ns: argparse.Namespace, env: Mapping[str, str], *, legacy: bool = False) -> EntrySpec:
    if ns.module and ns.no_python:
        raise UsageError("-m/--module", ns.training_script, "cannot be combined with --no-python")
    local_rank_arg = legacy and not ns.use_env
    if local_rank_arg and ns.no_python:
        raise UsageError("--no-python", ns.training_script, "needs --use-env with python -m rankrun.launch: a program "
                         "gets LOCAL_RANK in its environment, not --local-rank=N")
    kind = EntryKind.SCRIPT
    if ns.run_path:
        kind = EntryKind.RUN_PATH
    elif ns.no_python:
        kind = EntryKind.BINARY
    elif ns.module:
        kind = EntryKind.MODULE
    script: str = ns.training_script
    if kind in (EntryKind.SCRIPT, EntryKind.RUN_PATH) and not os.path.isfile(script):
        raise UsageError("training script", script, "no such file")
    if kind is EntryKind.BINARY and which(script) is None:
        raise UsageError("--no-python program", script, "not found on PATH or not executable")
    python = env.get("PYTHON_EXEC") or sys.executable
    return EntrySpec(kind=kind, script=script, args=tuple(ns.training_script_args), python=python,
                     local_rank_arg=local_rank_arg)


def preload_modules(value: str, entry: EntrySpec) -> tuple[str, ...]:
    """``--preload``'s module names, in order, each once; ``()`` for none (pure)."""
    names = tuple(dict.fromkeys(name.strip() for name in value.split(","))) if value.strip() else ()
    for name in names:
        if not name or not all(part.isidentifier() for part in name.split(".")):
            raise UsageError("--preload", value, f"{name!r} is not a module name" if name else "an empty module name")
    if names and entry.kind is EntryKind.BINARY:
        raise UsageError("--preload", value, "needs a Python worker: --no-python runs a program, which cannot be forked "
                         "from a Python process")
    return names


SLURM_SHAPE = ("standalone", "nnodes", "node_rank", "master_addr", "rdzv_endpoint")  # given: the user shapes the job


def _given(argv: Sequence[str], env: Mapping[str, str]) -> set[str]:
    """The options set on the command line or by a non-empty ``PET_`` variable (argparse's dest names)."""
    parser = build_parser({})
    for action in parser._actions:  # a parse that keeps only what was given
        action.default = argparse.SUPPRESS
    given = set(vars(parser.parse_known_args(list(argv))[0])) - {"training_script", "training_script_args"}
    options = [(names, pet) for names, pet, _ in _OPTIONS] + [(names, pet) for names, pet, _ in _FLAGS]
    by_env = {names[-1].lstrip("-").replace("-", "_") for names, pet in options if pet and env.get(f"PET_{pet}", "").strip()}
    return given | by_env


def _slurm(ns: argparse.Namespace, argv: Sequence[str], env: Mapping[str, str]) -> None:
    """Inside an ``srun`` step with none of the options that shape a job given: Slurm's shape (``rankrun.slurm``)
    becomes the defaults of the options left unset, and one line says so. Several tasks of the step on this node
    are refused: each would start every worker."""
    try:
        step = slurm.step_from(env)
    except ValueError as exc:
        raise UsageError("SLURM_STEP_NODELIST", env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", ""),
                         str(exc)) from None
    if step is None:
        return
    given = _given(argv, env)
    if given & set(SLURM_SHAPE):
        return
    if step.tasks_here > 1:
        raise UsageError("srun", f"{step.tasks_here} tasks on this node",
                         "rankrun starts every worker of a node itself: run one task per node (srun --ntasks-per-node=1), "
                         f"or {step.tasks_here} launchers would each start the node's workers")
    ns.nnodes, ns.node_rank, ns.master_addr = str(step.nnodes), step.node_id, step.master
    if "master_port" not in given:
        ns.master_port = step.port
    if "rdzv_id" not in given:
        ns.rdzv_id = step.run_id
    nproc_from = "--nproc-per-node"
    if "nproc_per_node" not in given:
        ns.nproc_per_node, nproc_from = str(step.gpus or 1), "SLURM_GPUS_ON_NODE" if step.gpus else "the default"
    print(f"rankrun: Slurm step {step.run_id}: node {step.node_id} of {step.nnodes}, master {step.master}:{ns.master_port} "
          f"(the first host of {step.nodelist}; port from {step.port_from if 'master_port' not in given else '--master-port'}), "
          f"{ns.nproc_per_node} worker(s) a node ({nproc_from})", file=sys.stderr)


def _nproc(value: str, env: Mapping[str, str]) -> int:
    needs_probe = value in ("gpu", "auto")
    gpus = devices.gpu_count(env) if needs_probe else None
    return parse_nproc(value, cpu_count=devices.cpu_count(), gpu_count=gpus)


def _rdzv_conf(ns: argparse.Namespace) -> RendezvousConf:
    """``--rdzv-conf``, with a line on stderr for what it ignores and for the etcd-v2 alias."""
    if ns.rdzv_backend == "etcd-v2":
        print(ETCD_V2_NOTE, file=sys.stderr)
    conf, unknown = parse_rdzv_conf(ns.rdzv_conf)
    if unknown:
        print(unknown_conf_note(unknown), file=sys.stderr)
    return conf


def _rendezvous(ns: argparse.Namespace) -> tuple[RendezvousSpec, StoreSpec]:
    """torchrun's backend resolution (its §2) into one of the three rendezvous kinds."""
    nodes = parse_nnodes(ns.nnodes)
    min_nodes, max_nodes = nodes
    backend = resolve_backend(ns.rdzv_backend)
    conf = _rdzv_conf(ns)
    if ns.master_port is not None:
        check_port("--master-port", ns.master_port)
    if ns.standalone and max_nodes > 1:
        raise UsageError("--nnodes", ns.nnodes, "--standalone runs one node; use --rdzv-backend c10d for several")
    if backend == "static" and conf.rank is None and not 0 <= ns.node_rank < max_nodes:
        raise UsageError("--node-rank", ns.node_rank, f"must be from 0 to {max_nodes - 1} with --nnodes {ns.nnodes}")
    local_host = ns.local_addr or "127.0.0.1"
    if ns.standalone or _implicitly_standalone(ns, backend, max_nodes):
        return _standalone(ns, conf, min_nodes, max_nodes), StoreSpec(local_host, 0)
    # torchrun: an empty --rdzv-id becomes a random uuid4's integer value
    run_id = ns.rdzv_id if ns.rdzv_id else str(int(uuid4_from(os.urandom(16)).replace("-", ""), 16))
    if backend == "static":
        return _static(ns, conf, run_id, nodes)
    if backend == "etcd":
        if ns.standalone:
            raise UsageError("--standalone", "", "runs its own store; drop it to use --rdzv-backend etcd")
        endpoints = parse_etcd_endpoints(ns.rdzv_endpoint or "127.0.0.1", conf.protocol)
        first = endpoints[0]
        return (DynamicRendezvous(backend, first.host, first.port, run_id, min_nodes, max_nodes, conf, endpoints),
                StoreSpec(local_host, 0))
    # torchrun's default for an empty c10d endpoint: localhost:29400
    host, port = parse_endpoint(ns.rdzv_endpoint or "localhost", C10D_DEFAULT_PORT)
    return DynamicRendezvous(backend, host, port, run_id, min_nodes, max_nodes, conf), StoreSpec(local_host, 0)


def _implicitly_standalone(ns: argparse.Namespace, backend: str, max_nodes: int) -> bool:
    """torchrun's rule: one node of the static backend with neither ``--rdzv-endpoint`` nor ``--master-port`` runs
    as ``--standalone`` would (a store of its own on a free port)."""
    return backend == "static" and not ns.rdzv_endpoint and ns.master_port is None and max_nodes == 1


def _standalone(ns: argparse.Namespace, conf: RendezvousConf, min_nodes: int, max_nodes: int) -> Standalone:
    """This node alone, under a fresh id; a line on stderr says when a ``--rdzv-id`` given goes unused."""
    fresh = uuid4_from(os.urandom(16))
    if (note := unused_id_note(ns.rdzv_id, fresh, explicit=ns.standalone)) is not None:
        print(note, file=sys.stderr)
    return Standalone(fresh, conf, min_nodes, max_nodes)


def _static(
    ns: argparse.Namespace, conf: RendezvousConf, run_id: str, nodes: tuple[int, int]
) -> tuple[StaticRendezvous, StoreSpec]:
    """The static backend: a fixed number of nodes, each given its rank (``--rdzv-conf rank=``, else
    ``--node-rank``), meeting at ``--rdzv-endpoint`` HOST:PORT, else ``--master-addr``:``--master-port``."""
    min_nodes, max_nodes = nodes
    if min_nodes != max_nodes:
        raise UsageError("--nnodes", ns.nnodes, "the static backend needs a fixed number of nodes (use --rdzv-backend c10d)")
    host, port = ns.master_addr, ns.master_port if ns.master_port is not None else STATIC_DEFAULT_PORT
    if ns.rdzv_endpoint:
        host, port = parse_endpoint(ns.rdzv_endpoint, -1)
        if port < 0:
            raise UsageError("--rdzv-endpoint", ns.rdzv_endpoint, "the static backend needs HOST:PORT")
    node_rank = conf.rank if conf.rank is not None else ns.node_rank
    if not 0 <= node_rank < max_nodes:
        raise UsageError("--node-rank", node_rank, f"must be from 0 to {max_nodes - 1} with --nnodes {ns.nnodes}")
    return StaticRendezvous(run_id, max_nodes, node_rank, host, port, conf), StoreSpec(host, port)


def _store_relays(value: str) -> bool | None:
    """``--store-relays``: on (1, true, yes, on), off (0, false, no, off) or auto (None)."""
    text = value.strip().lower()
    if text == "auto":
        return None
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise UsageError("--store-relays", value, "expected auto, 1 or 0")


def _secret(rdzv: RendezvousSpec, env: Mapping[str, str]) -> bytes | None:
    """The job's rendezvous secret: ``--rdzv-conf secret_file=PATH``, else ``$RANKRUN_RDZV_SECRET``."""
    path = rdzv.conf.secret_file
    if path is not None:
        try:
            secret = path.read_bytes().strip()
        except OSError as exc:
            raise UsageError("--rdzv-conf secret_file", str(path), f"cannot read it: {exc.strerror or exc}") from None
        if not secret:
            raise UsageError("--rdzv-conf secret_file", str(path), "the file is empty")
        return secret
    value = env.get("RANKRUN_RDZV_SECRET", "")
    return value.encode() if value else None


def _etcd_files(rdzv: RendezvousSpec) -> str | None:
    """Check the TLS files are readable now (one line, not a traceback later); the etcd password, read once."""
    conf = rdzv.conf
    for key, path in (("ca_cert", conf.ca_cert), ("ssl_cert", conf.ssl_cert), ("ssl_cert_key", conf.ssl_cert_key),
                      ("password_file", conf.password_file)):
        if path is not None and not os.access(path, os.R_OK):
            raise UsageError(f"--rdzv-conf {key}", str(path), "cannot read it")
    if conf.ssl_cert_key is not None and conf.ssl_cert is None:
        raise UsageError("--rdzv-conf ssl_cert_key", str(conf.ssl_cert_key), "needs ssl_cert too")
    if conf.password_file is None:
        return None
    if conf.user is None:
        raise UsageError("--rdzv-conf password_file", str(conf.password_file), "needs user= too")
    return conf.password_file.read_text().rstrip("\n")


def _log_dir(value: str | None) -> Path | None:
    if value is None:
        return None
    path = Path(value)
    if str(path) == "/dev/null":
        return path
    if path.exists() and not path.is_dir():
        raise UsageError("--log-dir", value, "exists and is not a directory")
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError("--log-dir", value, f"{existing} is not writable")
    return path


def _checkpoint_dir(value: str | None) -> Path | None:
    """``--checkpoint-dir``: made absolute (the launcher's working directory is not the workers'), created with its
    parents, and found writable now, so that a dir the background writer cannot use is one line before anything
    starts rather than a step lost at preemption. Writable means ``os.access`` and a probe file created and removed
    there: ``access`` answers yes to root on a filesystem that refuses every file (``/sys``, a read-only mount)."""
    if value is None:
        return None
    if not value.strip():
        raise UsageError("--checkpoint-dir", value, "expected a directory")
    path = Path(os.path.abspath(value))
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # mkdir's answer for a path that is there but is not a directory
        raise UsageError("--checkpoint-dir", value, "exists and is not a directory") from None
    except OSError as exc:
        raise UsageError("--checkpoint-dir", value, f"cannot create it: {exc.strerror or exc}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError("--checkpoint-dir", value, f"not writable: {os.strerror(errno.EACCES)}")
    probe = path / f".rankrun-probe.{os.getpid()}.{os.urandom(4).hex()}"  # unique: nodes sharing DIR probe at once
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(probe)
    except OSError as exc:
        raise UsageError("--checkpoint-dir", value, f"not writable: {exc.strerror or exc}") from None
    return path


def _logs(ns: argparse.Namespace, env: Mapping[str, str], nproc: int) -> LogSpec:
    template = ns.log_line_prefix_template
    if template is None:  # None: decided per run (raw with one rank on the console, prefixed with several)
        template = env.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE")
    return LogSpec(
        log_dir=_log_dir(ns.log_dir),
        redirects=parse_std_map("--redirects", ns.redirects, nproc),
        tee=parse_std_map("--tee", ns.tee, nproc),
        local_ranks_filter=parse_ranks_filter(ns.local_ranks_filter),
        prefix_template=template,
        stdout_filters=parse_filters(ns.duplicate_stdout_filters),
        stderr_filters=parse_filters(ns.duplicate_stderr_filters),
    )


def _restart(ns: argparse.Namespace, env: Mapping[str, str]) -> RestartPolicy:
    if ns.max_restarts < 0:
        raise UsageError("--max-restarts", ns.max_restarts, "must be 0 or more")
    if not ns.monitor_interval > 0:
        raise UsageError("--monitor-interval", ns.monitor_interval, "must be greater than 0")
    timeout = ns.shutdown_timeout
    if timeout is None:
        raw = env.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30")
        try:
            timeout = int(raw)
        except ValueError:
            raise UsageError("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", raw, "expected whole seconds") from None
    if timeout < 0:
        raise UsageError("--shutdown-timeout", timeout, "must be 0 or more")
    return RestartPolicy(max_restarts=ns.max_restarts, shutdown_timeout=float(timeout),
                         max_node_failures=_max_node_failures(ns.max_node_failures))


def _max_node_failures(value: str) -> int:
    try:
        count = int(value)
    except ValueError:
        raise UsageError("--max-node-failures", value, "expected a whole number (0: never exclude a node)") from None
    if count < 0:
        raise UsageError("--max-node-failures", value, "must be 0 or more")
    return count


# Test seam: the folder holding the sys/ (and proc/driver/nvidia/gpus) that --numa-binding reads instead of /.
SYSFS_ROOT_VARIABLE = "RANKRUN_SYSFS_ROOT"


def _numa(mode: str | None, env: Mapping[str, str], nproc: int) -> tuple[frozenset[int], ...]:
    """``--numa-binding``: the CPUs of each local rank, decided here so that a layout it cannot serve (no GPU, fewer
    GPUs than ranks, a node without CPUs) is one line before anything starts."""
    if mode is None:
        return ()
    from rankrun.numa.binding import BindingError, plan  # noqa: PLC0415 - only a binding run reads the layout
    from rankrun.numa.topology import read_topology  # noqa: PLC0415

    root = Path(env.get(SYSFS_ROOT_VARIABLE) or "/")
    allowed = frozenset(os.sched_getaffinity(0))  # torch's too: the launcher's own CPUs, not the machine's
    try:
        gpus = devices.visible_gpus(devices.driver_gpus(root), env.get("CUDA_VISIBLE_DEVICES"))
        if not gpus:
            where = "CUDA_VISIBLE_DEVICES, /proc/driver/nvidia, nvidia-smi"
            raise BindingError(f"no NVIDIA GPU found ({where}): binding puts each local rank near its GPU")
        return plan(mode, read_topology(root, mode, gpus, allowed), nproc, allowed)
    except (BindingError, ValueError) as exc:
        raise UsageError("--numa-binding", mode, str(exc)) from None


def _hang(ns: argparse.Namespace) -> HangSpec:
    timeout = _off_or_seconds("--hang-timeout", ns.hang_timeout)
    return HangSpec(timeout, _one_of("--hang-action", ns.hang_action, ("report", "fail")))


def _straggler(ns: argparse.Namespace) -> StragglerSpec:
    window = _off_or_seconds("--straggler-window", ns.straggler_window)
    return StragglerSpec(window, _one_of("--straggler-action", ns.straggler_action, ("report", "exclude")))


def _off_or_seconds(flag: str, value: str) -> float:
    """A period in seconds, 0 for off; ``UsageError`` naming ``flag`` otherwise."""
    try:
        seconds = float(value)
    except ValueError:
        raise UsageError(flag, value, "expected seconds (a number; 0: off)") from None
    if not 0 <= seconds < float("inf"):
        raise UsageError(flag, value, "must be 0 (off) or more")
    return seconds


def _one_of(flag: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise UsageError(flag, value, f"expected {' or '.join(choices)}")
    return value


def _health(ns: argparse.Namespace) -> HealthSpec:
    try:
        timeout = float(ns.health_check_timeout)
    except ValueError:
        raise UsageError("--health-check-timeout", ns.health_check_timeout, "expected seconds (a number)") from None
    if not 0 < timeout < float("inf"):
        raise UsageError("--health-check-timeout", ns.health_check_timeout, "must be more than 0")
    if ns.health_check is not None and not ns.health_check.strip():
        raise UsageError("--health-check", ns.health_check, "expected a command")
    return HealthSpec(ns.health_check, timeout, network=ns.network_check)


def _observe(ns: argparse.Namespace, env: Mapping[str, str], nproc: int) -> ObserveSpec:
    port: int | None = None
    if ns.metrics_port is not None:
        try:
            port = int(ns.metrics_port)
        except ValueError:
            raise UsageError("--metrics-port", ns.metrics_port, "expected a port number (0: the OS picks)") from None
        check_port("--metrics-port", port)
    if ns.events is not None and not ns.events:
        raise UsageError("--events", "", "expected a path (a file, a FIFO, /dev/stderr)")
    dcgm_dir = env.get("DCGM_HPC_JOB_MAPPING_DIR") or None  # dcgm-exporter's own variable for its mapping directory
    gpus: tuple[str | None, ...] = ()
    if dcgm_dir is not None:
        from rankrun.events.dcgm import gpu_ids  # noqa: PLC0415 - only a node that dcgm-exporter watches

        visible = env.get("CUDA_VISIBLE_DEVICES")
        uuids = [g.uuid for g in devices.driver_gpus()] if visible is not None and "GPU-" in visible else []
        gpus = gpu_ids(visible, nproc, uuids)
    return ObserveSpec(ns.events, port, torchelastic=ns.event_log_handler == "console", dcgm_dir=dcgm_dir, dcgm_gpus=gpus)


def _unsupported(ns: argparse.Namespace) -> None:
    if ns.logs_specs is not None and ns.logs_specs != "default":  # torchrun's default: the layout rankrun writes
        raise NotSupportedYetError("--logs-specs", ns.logs_specs, "LogsSpecs plugins other than torchrun's default are not "
                                   "supported; use --log-dir/-r/-t")
    if ns.start_method not in ("spawn", "fork", "forkserver"):  # argparse checks choices for flags, not PET_ defaults
        raise UsageError("--start-method", ns.start_method, "expected spawn, fork or forkserver")
    if ns.event_log_handler not in ("null", "console", "dynamic_rendezvous"):
        raise UsageError("--event-log-handler", ns.event_log_handler, "expected null, console or dynamic_rendezvous")


def spec_from_args(argv: Sequence[str], env: Mapping[str, str], *, legacy: bool = False) -> LaunchSpec:
    """The one translation of user input into a ``LaunchSpec``; raises ``UsageError``. ``legacy``: the command line
    of ``python -m rankrun.launch`` (torch.distributed.launch's, ``--use-env`` added)."""
    ns = parse_args(argv, env, legacy=legacy)
    if ns.stacks is not None:
        raise UsageError("--stacks", ns.stacks, "comes alone, first: rankrun --stacks [PID]")
    _slurm(ns, argv, env)
    nproc = _nproc(ns.nproc_per_node, env)
    rdzv, store = _rendezvous(ns)
    store = StoreSpec(store.host, store.port, _store_relays(ns.store_relays))
    _unsupported(ns)
    signals_text = ns.signals_to_handle
    return LaunchSpec(
        worker=WorkerSpec(nproc=nproc, role=ns.role, virtual_local_rank=ns.virtual_local_rank,
                          entry=(entry := _entry(ns, env, legacy=legacy)), cpus=_numa(ns.numa_binding, env, nproc),
                          preload=preload_modules(ns.preload, entry)),
        rendezvous=rdzv,
        store=store,
        restart=_restart(ns, env),
        logs=_logs(ns, env, nproc),
        signals=parse_signals(signals_text),
        signals_text=signals_text,
        base_env=dict(env),
        local_addr=ns.local_addr,
        secret=_secret(rdzv, env),
        etcd_password=_etcd_files(rdzv),
        hang=_hang(ns),
        observe=_observe(ns, env, nproc),
        health=_health(ns),
        straggler=_straggler(ns),
        checkpoint=CheckpointSpec(_checkpoint_dir(ns.checkpoint_dir)),
    )


def main(argv: Sequence[str] | None = None, catcher: EarlyCatcher | None = None, *, legacy: bool = False) -> int:
    """Entry point of ``rankrun`` and ``python -m rankrun`` (``legacy``: ``python -m rankrun.launch``); the exit code."""
    catcher = catcher or EarlyCatcher.install()
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["--stacks"] and not legacy:
        return _stacks(args[1:])
    try:
        spec = spec_from_args(args, os.environ, legacy=legacy)
    except RankrunError as exc:
        print(f"rankrun: error: {exc}", file=sys.stderr)
        return exc.exit_code
    from rankrun.main import launch  # noqa: PLC0415 - keeps --help and usage errors fast

    catcher.adopt(spec.signals)  # from here on exactly --signals-to-handle; the rest as inherited
    return launch(spec, catcher, note=LEGACY_NOTE if legacy else "")  # the note once a worker starts: bad input is one line


def _stacks(rest: list[str]) -> int:
    """``rankrun --stacks [PID]``: print the grouped stack report of a running job (see ``rankrun.stacks.control``)."""
    from rankrun.stacks.control import request  # noqa: PLC0415 - only this command needs it

    try:
        if len(rest) > 1:
            raise ArgumentError(f"--stacks takes at most one PID, got {' '.join(rest)}")
        if rest and not rest[0].isdigit():
            raise UsageError("--stacks", rest[0], "expected the PID of a rankrun launcher")
        print(request(int(rest[0]) if rest else None), end="", flush=True)
    except RankrunError as exc:
        print(f"rankrun: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return EXIT_SUCCESS


__all__ = ["main", "spec_from_args"]

