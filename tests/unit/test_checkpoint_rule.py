"""The consistent step (``rankrun.checkpoint.rule``): the step a restarted job resumes from, the world that saved it,
and where each rank reads its state — a table of the faults the design names, then a property over any holdings."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rankrun.checkpoint.rule import WHERE, Held, Resume, consistent, why_none


def _ranks(ranks, *entries):
    """The same ``entries`` (step, world, where) held by each of ``ranks``."""
    return {rank: [Held(*e) for e in entries] for rank in ranks}


def _all(world, where):
    return dict.fromkeys(range(world), where)


def test_every_rank_with_the_same_two_steps_resumes_from_the_newest():
    held = _ranks(range(4), (12, 4, "memory"), (11, 4, "memory"))
    assert consistent(held) == Resume(12, 4, _all(4, "memory"))
    assert why_none(held) is None


def test_a_rank_torn_inside_its_save_makes_the_job_resume_from_the_previous_step():
    held = {**_ranks([0, 1, 3], (12, 4, "memory"), (11, 4, "memory")), 2: [Held(11, 4, "memory"), Held(10, 4, "memory")]}
    assert consistent(held) == Resume(11, 4, _all(4, "memory"))


def test_a_new_smaller_world_reads_the_old_worlds_step_until_it_has_saved_its_own():
    old = _ranks(range(4), (20, 4, "disk"), (19, 4, "disk"))
    assert consistent(old) == Resume(20, 4, _all(4, "disk"))  # the job of 2 re-shards from the 4 old ranks' states
    half_saved = {**old, 0: [*old[0], Held(21, 2, "memory")]}  # the new world's rank 1 died before its first save
    assert consistent(half_saved) == Resume(20, 4, _all(4, "disk"))
    saved = {**half_saved, 1: [*old[1], Held(21, 2, "memory")]}
    assert consistent(saved) == Resume(21, 2, _all(2, "memory"))


def test_a_newer_step_of_a_larger_world_wins_over_an_older_one_of_a_smaller_world():
    held = {r: [Held(8, 4, "disk"), *([Held(7, 2, "memory")] if r < 2 else [])] for r in range(4)}
    assert consistent(held) == Resume(8, 4, _all(4, "disk"))


def test_the_same_step_kept_by_two_worlds_resumes_in_the_larger():
    held = {r: [Held(5, 4, "disk"), *([Held(5, 2, "memory")] if r < 2 else [])] for r in range(4)}
    assert consistent(held) == Resume(5, 4, _all(4, "disk"))
    fewer = {r: [Held(5, 4, "disk")] for r in range(3)} | {r: [Held(5, 2, "memory")] for r in range(2)}
    assert consistent(fewer) == Resume(5, 2, _all(2, "memory"))  # world 4 is not covered: rank 3 holds nothing


def test_a_ranks_entries_beyond_a_world_are_no_part_of_it():
    held = {**_ranks(range(2), (9, 2, "memory")), 5: [Held(9, 2, "memory")]}
    assert consistent(held) == Resume(9, 2, _all(2, "memory"))
    stray = _ranks([0, 1, 2, 5], (9, 4, "memory"))  # rank 3 is missing: rank 5 does not stand in for it
    assert consistent(stray) is None


def test_a_lost_nodes_ranks_are_read_from_the_neighbour_that_holds_them():
    held = {**_ranks(range(4), (12, 8, "memory"), (11, 8, "memory")), **_ranks(range(4, 8), (12, 8, "neighbour"))}
    assert consistent(held) == Resume(12, 8, {**_all(4, "memory"), 4: "neighbour", 5: "neighbour", 6: "neighbour",
                                              7: "neighbour"})


def test_a_node_lost_with_its_neighbour_falls_back_to_the_disk_copy():
    kept = [(12, 8, "memory"), (11, 8, "memory"), (10, 8, "disk")]
    held = {**_ranks(range(4), *kept), **_ranks(range(4, 8), (10, 8, "disk"))}
    assert consistent(held) == Resume(10, 8, _all(8, "disk"))
    also_in_memory = {**held, 0: [*held[0], Held(10, 8, "memory")], 1: [*held[1], Held(10, 8, "neighbour")]}
    assert consistent(also_in_memory) == Resume(10, 8, {**_all(8, "disk"), 0: "memory", 1: "neighbour"})


@pytest.mark.parametrize(("where", "nearest"), [
    (("disk", "neighbour", "memory"), "memory"), (("disk", "neighbour"), "neighbour"), (("neighbour", "memory"), "memory"),
    (("disk",), "disk"),
])
def test_each_rank_reads_the_nearest_copy(where, nearest):
    held = {0: [Held(3, 1, w) for w in where]}
    assert consistent(held) == Resume(3, 1, {0: nearest})


def test_ranks_two_saves_apart_share_no_step_and_say_so():
    held = {**_ranks(range(4), (12, 8, "memory"), (11, 8, "memory")),
            **_ranks(range(4, 8), (10, 8, "memory"), (9, 8, "memory"))}
    assert consistent(held) is None
    assert why_none(held) == "no step is kept by every rank: ranks 0-3 kept step 12, ranks 4-7 kept step 10"


def test_ranks_that_kept_nothing_are_said_last():
    held = {0: [Held(12, 4, "memory")], **_ranks([2, 3], (11, 4, "memory"))}
    assert why_none(held) == "no step is kept by every rank: rank 0 kept step 12, ranks 2-3 kept step 11, rank 1 kept nothing"


def test_every_world_held_is_said_the_largest_first():
    held = {0: [Held(21, 2, "memory"), Held(20, 4, "disk")], 2: [Held(20, 4, "disk")]}
    assert why_none(held) == ("no step is kept by every rank: world 4: ranks 0,2 kept step 20, ranks 1,3 kept nothing; "
                              "world 2: rank 0 kept step 21, rank 1 kept nothing")


def test_ranks_too_scattered_for_a_line_are_counted():
    held = {r: [Held(12 if r % 2 else 10, 64, "memory")] for r in range(64)}
    assert why_none(held) == "no step is kept by every rank: 32 ranks kept step 12, 32 ranks kept step 10"
    held = {r: [Held(12 if r < 14 else 10, 16, "memory")] for r in (*range(13), 14, 15)}
    assert why_none(held) == ("no step is kept by every rank: ranks 0-12 kept step 12, ranks 14-15 kept step 10, "
                              "rank 13 kept nothing")


@pytest.mark.parametrize(("last", "said"), [(100, "ranks 0,2,4,6,8,10,12,14,16,18,20,22,24,26,100"), (1000, "15 ranks")])
def test_a_range_string_of_up_to_40_characters_is_said_whole(last, said):
    newer = [*range(0, 28, 2), last]
    held = {r: [Held(12 if r in newer else 10, last + 1, "disk")] for r in range(last + 1)}
    assert why_none(held).startswith(f"no step is kept by every rank: {said} kept step 12, ")


@pytest.mark.parametrize("held", [{}, {0: []}, {0: [], 3: ()}])
def test_nothing_held_is_none_and_nothing_to_say(held):
    assert consistent(held) is None
    assert why_none(held) is None


@pytest.mark.parametrize(("args", "message"), [
    ((1, 0, "memory"), "at least one rank: 0"), ((1, -2, "disk"), "at least one rank: -2"),
    ((1, 2, "dir"), "in memory, neighbour, disk, not 'dir'"), ((1, 2, "Memory"), "not 'Memory'"),
])
def test_a_held_step_is_of_a_world_and_in_a_known_place(args, message):
    with pytest.raises(ValueError, match=message):
        Held(*args)


_HELD = st.builds(Held, st.integers(0, 5), st.integers(1, 6), st.sampled_from(WHERE))


def _holds(held, rank, step, world):
    return any((e.step, e.world) == (step, world) for e in held.get(rank, ()))


@given(st.dictionaries(st.integers(0, 7), st.lists(_HELD, max_size=5), max_size=8))
def test_the_answer_is_covered_by_every_rank_and_nothing_newer_is(held):
    answer = consistent(held)
    pairs = {(e.step, e.world) for entries in held.values() for e in entries}
    covered = {(s, w) for s, w in pairs if all(_holds(held, r, s, w) for r in range(w))}
    if answer is None:
        assert not covered
        assert (why_none(held) is None) == (not pairs)
        return
    assert all(_holds(held, r, answer.step, answer.world) for r in range(answer.world))
    assert (answer.step, answer.world) == max(covered)
    assert set(answer.where) == set(range(answer.world))
    for rank, where in answer.where.items():
        places = [e.where for e in held[rank] if (e.step, e.world) == (answer.step, answer.world)]
        assert where == min(places, key=WHERE.index)
    assert why_none(held) is None
