"""The kept memory's layout and commit rule (``rankrun.checkpoint.slots``): a save torn after any byte is never seen."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankrun.checkpoint import slots
from rankrun.checkpoint.slots import COMPLETE, WRITING, Desc


def _header() -> bytearray:
    buf = bytearray(slots.HEADER)
    slots.init(buf)
    return buf


def test_a_fresh_header_has_nothing_kept_and_the_first_save_goes_to_slot_0():
    buf = _header()
    assert slots.valid(buf)
    assert slots.newest(buf) is None and slots.complete(buf) == []
    assert slots.choose(buf) == (0, 1)
    assert not slots.valid(bytearray(slots.HEADER))


def test_descriptors_round_trip_and_a_flipped_bit_is_not_read():
    buf = _header()
    desc = Desc(7, 120, 8, 3, 1 << 30, COMPLETE, 1_700_000_000_000_000_000, 0.25)
    slots.write(buf, 1, desc)
    assert slots.read(buf, 1) == desc
    assert slots.read(buf, 0) is None
    buf[64 + 64 + 9] ^= 1  # in step
    assert slots.read(buf, 1) is None


def test_saves_alternate_between_the_slots_and_keep_the_previous_step():
    buf = _header()
    for step in range(1, 6):
        index, gen = slots.choose(buf)
        slots.write(buf, index, Desc(gen, step, 2, 0, 100, WRITING))
        slots.write(buf, index, Desc(gen, step, 2, 0, 100, COMPLETE))
        assert slots.newest(buf) == (index, Desc(gen, step, 2, 0, 100, COMPLETE))
        assert [d.step for _, d in slots.complete(buf)] == [step, step - 1][:min(step, 2)]
        assert gen == step and index == (step - 1) % 2


def test_a_slot_being_written_does_not_count_and_gen_still_advances():
    buf = _header()
    slots.write(buf, 0, Desc(1, 1, 2, 0, 10, COMPLETE))
    slots.write(buf, 1, Desc(2, 2, 2, 0, 0, WRITING))
    assert slots.newest(buf) == (0, Desc(1, 1, 2, 0, 10, COMPLETE))
    assert slots.choose(buf) == (1, 3)  # the torn slot again, with a newer gen than any seen


def _stores(buf: bytearray, step: int) -> list[tuple[int, bytes]]:
    """The byte stores one save makes into the header, in order: the WRITING descriptor, then the COMPLETE one."""
    index, gen = slots.choose(buf)
    out = []
    for state in (WRITING, COMPLETE):
        scratch = bytearray(buf)
        slots.write(scratch, index, Desc(gen, step, 4, 1, 1000 + step, state, 5, 0.5))
        at = 64 + 64 * index
        out.append((at, bytes(scratch[at:at + slots.DESC_BYTES])))
    return out


@settings(max_examples=300, deadline=None)
@given(saves=st.integers(min_value=0, max_value=4), cut=st.integers(min_value=0, max_value=2 * slots.DESC_BYTES))
def test_a_save_torn_after_any_byte_leaves_the_previous_step_or_the_new_one(saves, cut):
    buf = _header()
    for step in range(1, saves + 1):
        for at, data in _stores(buf, step):
            buf[at:at + len(data)] = data
    previous = slots.newest(buf)
    stores = _stores(buf, saves + 1)
    written = 0
    for at, data in stores:  # the process dies after `cut` bytes of the stores, in any byte
        n = max(0, min(len(data), cut - written))
        buf[at:at + n] = data[:n]
        written += len(data)
    found = slots.newest(buf)
    if cut >= 2 * slots.DESC_BYTES:
        assert found is not None and found[1].step == saves + 1
    else:
        assert found == previous
    kept_steps = [d.step for _, d in slots.complete(buf)]
    assert set(kept_steps) <= {saves + 1, saves, saves - 1}


@pytest.mark.parametrize("slot", [0, 1])
def test_the_writer_never_touches_the_newest_complete_slot(slot):
    buf = _header()
    slots.write(buf, slot, Desc(5, 50, 2, 0, 10, COMPLETE))
    slots.write(buf, 1 - slot, Desc(4, 40, 2, 0, 10, COMPLETE))
    assert slots.choose(buf) == (1 - slot, 6)
