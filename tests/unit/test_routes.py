"""Where worker output goes (logs/routes.py, pure): the note for a --local-ranks-filter that shows nothing here."""

from __future__ import annotations

import pytest

from rankrun.errors import UsageError
from rankrun.logs.routes import filter_note
from rankrun.spec import LogSpec, Stream, parse_ranks_filter


def logs(chosen: str) -> LogSpec:
    return LogSpec(None, (Stream.NONE,) * 2, (Stream.NONE,) * 2, parse_ranks_filter(chosen), None)


@pytest.mark.parametrize(("chosen", "nproc", "note"), [
    ("7", 2, "warning: --local-ranks-filter 7 names no local rank of this node (it runs local ranks 0-1):"
             " no worker's output reaches its console"),
    ("5,3", 1, "warning: --local-ranks-filter 3,5 names no local rank of this node (it runs local rank 0):"
               " no worker's output reaches its console"),
    ("2", 2, "warning: --local-ranks-filter 2 names no local rank of this node (it runs local ranks 0-1):"
             " no worker's output reaches its console"),
    ("1", 2, None),  # the last local rank
    ("4,0", 2, None),  # some of them: another node may run more (one command line for nodes of different sizes)
    ("", 2, None),  # no filter
])
def test_a_filter_that_names_none_of_this_nodes_local_ranks_gets_a_warning(chosen, nproc, note):
    assert filter_note(logs(chosen), nproc) == note


def test_a_negative_local_rank_can_never_match_and_is_bad_input():
    with pytest.raises(UsageError) as err:
        parse_ranks_filter("0,-1")
    assert str(err.value) == "--local-ranks-filter '0,-1': local ranks are 0 or more"
    assert parse_ranks_filter("0") == frozenset({0})
