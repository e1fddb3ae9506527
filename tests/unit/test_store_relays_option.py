"""``--store-relays``: its spellings and values, alone before the script, from ``PET_STORE_RELAYS``; and the decision
(``fdlimit.relays_wanted``) and the host's lines (``fdlimit.relay_budget``)."""

from __future__ import annotations

import pytest

from rankrun import fdlimit
from rankrun.cli import spec_from_args
from rankrun.errors import UsageError
from rankrun.fdlimit import OWN, PER_LOCAL_WORKER, relays_wanted


def _relays(tmp_path, *argv, env=None):
    script = tmp_path / "t.py"
    script.write_text("")
    spec = spec_from_args([*argv, str(script), "--store-relays", "0"], env or {})
    assert spec.worker.entry.args == ("--store-relays", "0")  # the script's own arguments are never read
    return spec.store.relays


@pytest.mark.parametrize(("argv", "expected"), [
    ((), None),
    (("--store-relays",), True),  # alone, right before the script: the flag, not the script as its value
    (("--store_relays",), True),
    (("--store-relays", "1"), True),
    (("--store-relays=0",), False),
    (("--store-relays", "off"), False),
    (("--store-relays", "auto"), None),
    (("--store-relays", "--nproc-per-node", "2"), True),
    (("--nnodes", "2", "--store-relays", "yes"), True),
])
def test_the_option(tmp_path, argv, expected):
    assert _relays(tmp_path, *argv) is expected


@pytest.mark.parametrize(("value", "expected"), [("1", True), ("0", False), ("auto", None), ("", None)])
def test_pet_store_relays(tmp_path, value, expected):
    assert _relays(tmp_path, env={"PET_STORE_RELAYS": value}) is expected


def test_a_bad_value_is_one_line(tmp_path):
    with pytest.raises(UsageError, match=r"--store-relays.*maybe.*expected auto, 1 or 0"):
        _relays(tmp_path, "--store-relays=maybe")


def test_relays_are_wanted_as_asked_else_when_the_host_cannot_hold_a_connection_per_rank():
    fits = 25000 + 25 + PER_LOCAL_WORKER * 8 + OWN
    kw = {"world_size": 25000, "nodes": 25, "local_workers": 8, "hard": 20000}
    assert relays_wanted(None, soft=fits, **kw) is False
    assert relays_wanted(None, soft=fits - 1, **kw) is True
    assert relays_wanted(True, soft=fits, **kw) is True
    assert relays_wanted(False, soft=fits - 1, **kw) is False


def test_the_hosts_lines_with_relays(monkeypatch):
    monkeypatch.setattr(fdlimit, "nofile", lambda: (20000, 20000))
    auto = fdlimit.relay_budget(world_size=25000, nodes=25, local_workers=8, asked=False)
    assert len(auto) == 1
    assert "cannot hold 25000 worker-store connections" in auto[0]
    assert "store relays are used" in auto[0]
    assert "holds about 33" in auto[0]
    assert fdlimit.relay_budget(world_size=25000, nodes=25, local_workers=8, asked=True) == []
    monkeypatch.setattr(fdlimit, "nofile", lambda: (100, 100))
    short = fdlimit.relay_budget(world_size=25000, nodes=25, local_workers=8, asked=True)
    assert len(short) == 1 and "needs about" in short[0]  # even one connection per node does not fit: said
