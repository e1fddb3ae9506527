"""``fd_budget``: whether a host's open-files limit holds the job's connections, and the one line when it does not."""

from __future__ import annotations

import resource

from rankrun.fdlimit import OWN, PER_LOCAL_WORKER, fd_budget, listen_budget, rendezvous_group


def test_a_job_that_fits_says_nothing() -> None:
    need = 4096 + 512 + PER_LOCAL_WORKER * 8 + OWN
    assert fd_budget(world_size=4096, nodes=512, local_workers=8, soft=need, hard=need) is None


def test_one_past_the_limit_names_the_limit_the_need_and_ulimit_when_the_hard_limit_allows() -> None:
    need = 4096 + PER_LOCAL_WORKER * 8 + OWN
    line = fd_budget(world_size=4096, nodes=0, local_workers=8, soft=need - 1, hard=20000)
    assert line is not None
    assert "\n" not in line
    assert f"about {need} open files" in line
    assert "4096 worker-store connections (one per rank)" in line
    assert "rendezvous" not in line  # etcd: the nodes' connections are etcd's
    assert f"RLIMIT_NOFILE) is {need - 1} (hard 20000)" in line
    assert f"`ulimit -n {need}`" in line


def test_past_the_hard_limit_the_fix_is_the_hard_limit() -> None:
    line = fd_budget(world_size=32768, nodes=4096, local_workers=8, soft=20000, hard=20000)
    assert line is not None
    assert "4096 rendezvous connections (one per node)" in line
    assert "raise the hard limit to at least 36992" in line
    assert "ulimit -n" not in line


def test_an_unlimited_hard_limit_is_said_so() -> None:
    line = fd_budget(world_size=2048, nodes=0, local_workers=1, soft=1024, hard=resource.RLIM_INFINITY)
    assert line is not None
    assert "(hard unlimited)" in line
    assert "`ulimit -n 2120`" in line


def test_a_listen_queue_that_holds_every_rank_says_nothing() -> None:
    assert listen_budget(world_size=4096, somaxconn=4096) is None


def test_a_listen_queue_below_the_world_size_says_what_to_set() -> None:
    line = listen_budget(world_size=16384, somaxconn=4096)
    assert line is not None
    assert "\n" not in line
    assert "net.core.somaxconn is 4096, below the 16384 ranks" in line
    assert "`sysctl -w net.core.somaxconn=16384`" in line


def test_a_syn_backlog_below_the_world_size_matters_only_with_syn_cookies_off() -> None:
    assert listen_budget(world_size=16384, somaxconn=65535, syn_backlog=2048, syncookies=1) is None
    assert listen_budget(world_size=16384, somaxconn=65535, syn_backlog=2048, syncookies=None) is None
    line = listen_budget(world_size=16384, somaxconn=65535, syn_backlog=2048, syncookies=0)
    assert line is not None
    assert "\n" not in line
    assert line.startswith("net.ipv4.tcp_max_syn_backlog is 2048 with SYN cookies off")
    assert "`sysctl -w net.ipv4.tcp_max_syn_backlog=21846`" in line  # 3/4 of it holds every rank
    assert listen_budget(world_size=16384, somaxconn=65535, syn_backlog=21846, syncookies=0) is None


def test_both_queues_short_are_said_in_one_line() -> None:
    line = listen_budget(world_size=16384, somaxconn=4096, syn_backlog=2048, syncookies=0)
    assert line is not None
    assert "\n" not in line
    assert line.startswith("net.core.somaxconn is 4096 and net.ipv4.tcp_max_syn_backlog is 2048")
    assert "set `sysctl -w net.core.somaxconn=16384` and `sysctl -w net.ipv4.tcp_max_syn_backlog=21846`" in line


def test_rendezvous_relays_only_past_the_limit_and_about_sqrt_nodes_each() -> None:
    assert rendezvous_group(None, nodes=4_096, local_workers=8, soft=20_000) == 0  # 2 x 4,096 + its own fit
    assert rendezvous_group(None, nodes=16_384, local_workers=8, soft=20_000) == 128  # 2 x 16,384 do not
    assert rendezvous_group(None, nodes=32_768, local_workers=8, soft=20_000) == 182
    assert rendezvous_group(None, nodes=1_000, local_workers=8, soft=1_024) == 32
    assert rendezvous_group(0, nodes=32_768, local_workers=8, soft=1_024) == 0  # asked: never
    assert rendezvous_group(3, nodes=4, local_workers=1, soft=20_000) == 3  # asked: whatever the limit
