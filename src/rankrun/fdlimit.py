"""Open-file limits: the launcher's soft ``RLIMIT_NOFILE`` raised to the hard limit at start, and whether a job fits
(its connections under that limit, its connect storm in the listen queue).

The host of a job holds one connection per rank in the workers' store and, for the embedded rendezvous, one per node:
a 4,096-rank job cannot be served by a process whose soft limit is the common default of 1,024. Raising the soft limit
to the hard one needs no privilege (the hard limit is what an administrator chose), so the launcher does it once, at
start; a failure is ignored (the check below then says what does not fit). Workers inherit the raised limit.
``fd_budget`` is the decision, pure: what the job needs against what the process has, as one line to say (or None);
``listen_budget`` the same for the listen queue: every rank connects to the workers' store within a second, and a
connection past ``net.core.somaxconn`` is dropped (its client retries after 1 s; measured at 16,384 ranks: thousands
of ``ListenOverflows``), and so is a SYN past 3/4 of ``net.ipv4.tcp_max_syn_backlog`` where SYN cookies are off.
"""

from __future__ import annotations

import contextlib
import math
import resource
from pathlib import Path

OWN = 64
"""Descriptors the launcher holds whatever the job: stdio, its loop, listeners, the console, the event log."""
PER_LOCAL_WORKER = 8
"""Per worker of this node: its stdout/stderr pipes, its pidfd, its log files, its stack channel (generous)."""
_NR_OPEN = Path("/proc/sys/fs/nr_open")  # the kernel's ceiling for any RLIMIT_NOFILE (an infinite hard limit)
_SOMAXCONN = Path("/proc/sys/net/core/somaxconn")  # the kernel's ceiling for any listen backlog
_SYN_BACKLOG = Path("/proc/sys/net/ipv4/tcp_max_syn_backlog")  # half-open connections kept when SYN cookies are off
_SYNCOOKIES = Path("/proc/sys/net/ipv4/tcp_syncookies")  # 0: off, 1: past the SYN queue (the default), 2: always


def nofile() -> tuple[int, int]:
    """This process's (soft, hard) ``RLIMIT_NOFILE``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft, hard


def raise_soft_limit() -> tuple[int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit (never lowered; any failure ignored); the (soft, hard) after."""
    soft, hard = nofile()
    target = hard
    if hard == resource.RLIM_INFINITY:  # Linux refuses an infinite soft limit: its ceiling is fs.nr_open
        try:
            target = int(_NR_OPEN.read_text())
        except (OSError, ValueError):
            return soft, hard
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return nofile()


def fd_budget(*, world_size: int, nodes: int, local_workers: int, soft: int, hard: int) -> str | None:
    """One line when a host serving ``world_size`` ranks' store connections and ``nodes`` rendezvous connections (0
    where it serves none, e.g. etcd) with ``local_workers`` of its own cannot fit under ``soft`` open files; else None.
    """
    need = world_size + nodes + PER_LOCAL_WORKER * local_workers + OWN
    if need <= soft:
        return None
    what = f"{world_size} worker-store connections (one per rank)"
    if nodes:
        what += f", {nodes} rendezvous connections (one per node)"
    limit = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    fix = (f"raise the hard limit to at least {need} for the user running rankrun (limits.conf nofile, systemd "
           f"LimitNOFILE=, docker --ulimit nofile=)" if hard != resource.RLIM_INFINITY and hard < need
           else f"run `ulimit -n {need}` before rankrun")
    return (f"this host needs about {need} open files ({what}, and its own) but its open-files limit (RLIMIT_NOFILE) "
            f"is {soft} (hard {limit}): the ranks past it cannot connect and the job will hang in init_process_group; {fix}")


def job_fits(*, world_size: int, nodes: int, local_workers: int) -> str | None:
    """``fd_budget`` against this process's limits now: the line to say before any worker starts, or None."""
    soft, hard = nofile()
    return fd_budget(world_size=world_size, nodes=nodes, local_workers=local_workers, soft=soft, hard=hard)


def listen_budget(*, world_size: int, somaxconn: int, syn_backlog: int | None = None,
                  syncookies: int | None = None) -> str | None:
    """One line when ``world_size`` ranks connecting at once cannot all wait in this host's listen queues, else None.

    The accept queue is capped at ``somaxconn`` (net.core.somaxconn). The SYN queue is capped by the same backlog; past
    it the kernel answers with SYN cookies, unless ``syncookies`` (net.ipv4.tcp_syncookies) is 0: then it also drops
    SYNs from new peers once the queue holds 3/4 of ``syn_backlog`` (net.ipv4.tcp_max_syn_backlog). None: unknown.
    """
    short: list[str] = []
    fixes: list[str] = []
    if somaxconn < world_size:
        short.append(f"net.core.somaxconn is {somaxconn}")
        fixes.append(f"`sysctl -w net.core.somaxconn={world_size}`")
    if syncookies == 0 and syn_backlog is not None and syn_backlog * 3 // 4 < world_size:
        short.append(f"net.ipv4.tcp_max_syn_backlog is {syn_backlog} with SYN cookies off (net.ipv4.tcp_syncookies=0: "
                     f"SYNs past 3/4 of it are dropped)")
        fixes.append(f"`sysctl -w net.ipv4.tcp_max_syn_backlog={-(-world_size * 4 // 3)}`")
    if not short:
        return None
    return (f"{' and '.join(short)}, below the {world_size} ranks that connect to the workers' store at once: "
            f"connections past the listen queue are dropped and retried 1 s later, slowing init_process_group; "
            f"set {' and '.join(fixes)} on this host")


def _sysctl(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def listen_fits(*, world_size: int) -> str | None:
    """``listen_budget`` against this host's sysctls (None where net.core.somaxconn cannot be read)."""
    somaxconn = _sysctl(_SOMAXCONN)
    if somaxconn is None:
        return None
    return listen_budget(world_size=world_size, somaxconn=somaxconn, syn_backlog=_sysctl(_SYN_BACKLOG),
                         syncookies=_sysctl(_SYNCOOKIES))


def relays_wanted(option: bool | None, *, world_size: int, nodes: int, local_workers: int, soft: int, hard: int) -> bool:
    """Whether the nodes relay their workers' store connections (``--store-relays``): as asked, else (auto) when the
    host cannot hold one connection per rank (``fd_budget``). Every node decides from its own limits: nodes of one job
    normally share them, and a node that decides otherwise is still served (relayed or not, a worker's connection is
    the same to the host's store)."""
    if option is not None:
        return option
    return fd_budget(world_size=world_size, nodes=nodes, local_workers=local_workers, soft=soft, hard=hard) is not None


def relay_budget(*, world_size: int, nodes: int, local_workers: int, asked: bool) -> list[str]:
    """The host's lines for a job whose other nodes relay: that relays are used (when it was the automatic choice), and
    ``fd_budget``'s line if even ``nodes`` relays' connections and its own workers' do not fit."""
    soft, hard = nofile()
    lines = [] if asked else [
        f"this host cannot hold {world_size} worker-store connections (one per rank) under its open-files limit "
        f"(RLIMIT_NOFILE {soft}): store relays are used: each other node's agent serves its own workers' connections "
        f"and forwards them over one connection, so this host holds about {nodes + local_workers} (--store-relays 0: "
        f"never)"]
    short = fd_budget(world_size=nodes + local_workers, nodes=nodes, local_workers=local_workers, soft=soft, hard=hard)
    if short is not None:
        lines.append(short)
    return lines


def rendezvous_group(asked: int | None, *, nodes: int, local_workers: int, soft: int) -> int:
    """Nodes per rendezvous relay (``store.embedded.routing``): as asked (``--rdzv-conf relay_group``; 0: never), else
    (auto) none while the host can hold every node's rendezvous connection and one workers'-store connection per node
    (``--store-relays``'s floor) under its ``soft`` open-files limit, and ceil(sqrt(nodes)) past it: then no process
    holds more than about twice sqrt(nodes) rendezvous connections (the host: a relay's own and its node's, per relay;
    a relay: its group)."""
    if asked is not None:
        return asked
    if 2 * nodes + PER_LOCAL_WORKER * local_workers + OWN <= soft:
        return 0
    return math.isqrt(nodes - 1) + 1
