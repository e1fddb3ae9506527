"""``store.memory.SortedKeys``: the in-memory store's sorted keys in chunks, against a plain sorted list (random
inserts, removals and prefix scans, with chunks small enough to split and empty many times)."""

from __future__ import annotations

import bisect
import random

import pytest

from rankrun.store.memory import SortedKeys


@pytest.mark.parametrize("seed", range(20))
def test_sorted_keys_scan_as_a_sorted_list_does(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SortedKeys, "CHUNK", 2)
    rng = random.Random(seed)
    keys, reference = SortedKeys(), []
    for _ in range(400):
        key = "".join(rng.choice("ab/") for _ in range(rng.randint(1, 6)))
        if key in reference:
            if rng.random() < 0.7:
                keys.remove(key)
                reference.remove(key)
        else:
            keys.add(key)
            bisect.insort(reference, key)
        prefix = "".join(rng.choice("ab/") for _ in range(rng.randint(0, 3)))
        assert list(keys.starting(prefix)) == [k for k in reference if k.startswith(prefix)]
    assert len(keys) == len(reference)
    assert list(keys.starting("")) == reference


def test_a_key_past_every_other_goes_last() -> None:
    keys = SortedKeys()
    for key in ("/r/nodes/a", "/r/nodes/b", "/r/round", "/r/nodes/c"):
        keys.add(key)
    assert list(keys.starting("/r/nodes/")) == ["/r/nodes/a", "/r/nodes/b", "/r/nodes/c"]
    assert list(keys.starting("/r/z")) == []
