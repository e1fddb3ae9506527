"""``rankrun.launch`` from a caller that already imported torch and made a tensor: fresh workers, a gloo all_reduce,
the sum back from every rank (no fork of the caller, so whatever it initialised does not matter)."""

from __future__ import annotations

import pytest

import rankrun

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("private_tmpdir")


def _all_reduce(base: float) -> float:
    import os  # noqa: PLC0415 - in the worker

    import torch.distributed as dist  # noqa: PLC0415

    dist.init_process_group("gloo", init_method="env://")
    value = torch.tensor([base + int(os.environ["RANK"])])
    dist.all_reduce(value)
    dist.destroy_process_group()
    return float(value.item())


def test_two_gloo_workers_all_reduce_and_both_sums_come_back(capsys):
    in_the_caller = torch.ones(2)  # torch imported and used here first
    assert rankrun.launch(_all_reduce, float(in_the_caller.sum()), nproc_per_node=2) == {0: 5.0, 1: 5.0}
    capsys.readouterr()
