"""The arrivals file the workers' shim appends to (``rankrun.straggler.frfile``): whole lines only, in order."""

from __future__ import annotations

from pathlib import Path

import pytest

from rankrun.straggler import frfile
from rankrun.straggler.frfile import Arrival, parse_line, read_new


def test_whole_lines_are_read_and_a_partial_last_line_waits_for_the_next_read(tmp_path: Path) -> None:
    path = tmp_path / "rank_1.fr"
    assert read_new(path, 0) == ([], 0)  # no file yet: the worker recorded nothing
    path.write_bytes(b"0 1 1700000000000000000\n0 2 1700000000200000000\n0 3 17000000004")  # a dump still being written
    arrivals, offset = read_new(path, 0)
    assert arrivals == [Arrival("0", 1, 1700000000000000000), Arrival("0", 2, 1700000000200000000)]
    assert offset == path.read_bytes().index(b"0 3 ")
    assert read_new(path, offset) == ([], offset)  # still partial: nothing, and the same offset
    with path.open("ab") as fh:
        fh.write(b"00000000\nsub group 1 1700000000500000000\n")
    arrivals, end = read_new(path, offset)
    assert arrivals == [Arrival("0", 3, 1700000000400000000), Arrival("sub group", 1, 1700000000500000000)]
    assert end == path.stat().st_size
    assert read_new(path, end) == ([], end)


@pytest.mark.parametrize("line", ["", "0 1", "0 x 5", "0 1 y", " 1 2", "0 1 2 3x"])
def test_a_line_that_is_not_an_arrival_is_none(line: str) -> None:
    assert parse_line(line) is None


def test_a_bad_line_is_skipped_and_the_rest_read(tmp_path: Path) -> None:
    path = tmp_path / "rank_0.fr"
    path.write_bytes(b"garbage\n\xff\xfe 1 2\n7 4 99\n")
    arrivals, offset = read_new(path, 0)
    assert arrivals == [Arrival("\ufffd\ufffd", 1, 2), Arrival("7", 4, 99)] and offset == path.stat().st_size


def test_an_arrival_is_a_frozen_value() -> None:
    a = Arrival("0", 1, 2)
    assert a == Arrival("0", 1, 2) and hash(a) == hash(Arrival("0", 1, 2))
    with pytest.raises(AttributeError):
        a.seq = 3  # type: ignore[misc]


def test_the_shims_word_on_the_recorder_is_read_apart_from_the_arrivals(tmp_path):
    path = tmp_path / "rank_0.fr"
    path.write_text("rankrun-arrivals on\n0 1 1000\n")
    first = frfile.read(path, 0)
    assert (first.status, [a.seq for a in first.arrivals]) == ("on", [1])
    with path.open("a") as fh:
        fh.write("rankrun-arrivals off AttributeError\n")
    assert frfile.read(path, first.offset) == frfile.Read([], path.stat().st_size, "off AttributeError")
    assert frfile.read(tmp_path / "none.fr", 0) == frfile.Read([], 0)
