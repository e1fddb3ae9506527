"""First contact: ``rankrun --help`` grouped the way a reader looks for an option (every option under exactly one
heading, one spelling shown of each, both parse), and a mistyped option named with the closest real one."""

from __future__ import annotations

import re

import pytest

import rankrun.cli
from rankrun.cli import build_parser, parse_args, unknown_options
from rankrun.errors import ArgumentError

HEADINGS = ["positional arguments", "options", "torchrun's options", "several nodes", "start-up", "faults and restarts",
            "observing", "health", "stragglers", "large jobs"]


def _sections(text: str) -> dict[str, list[str]]:
    """Each heading's (an unindented ``title:`` line) option invocations: its lines that start with ``  -``."""
    out: dict[str, list[str]] = {}
    current = ""
    for line in text.splitlines():
        if re.fullmatch(r"[a-z][^:]*:", line):
            current = line[:-1]
            out[current] = []
        elif line.startswith("  -"):
            out[current].append(line.split("  ", 2)[1].strip())
    return out


@pytest.mark.parametrize("legacy", [False, True], ids=["rankrun", "rankrun.launch"])
def test_every_option_is_under_exactly_one_heading_in_the_readers_order(monkeypatch, legacy):
    monkeypatch.setenv("COLUMNS", "200")  # one invocation a line: no wrapping to read around
    parser = build_parser({}, legacy=legacy)
    sections = _sections(parser.format_help())
    assert list(sections) == HEADINGS
    options = [a for a in parser._actions if a.option_strings]
    for action in options:
        first = action.option_strings[0]
        under = [title for title, lines in sections.items()
                 if any(re.match(rf"{re.escape(first)}(\s|,|$)", line) for line in lines)]
        assert len(under) == 1, (first, under)
    groups = [g for g in parser._action_groups if g.title in HEADINGS]
    held = [a for g in groups for a in g._group_actions]
    assert sorted(map(id, held)) == sorted(id(a) for a in parser._actions)  # each action in one group, none left out
    assert ("--use-env" in sections["torchrun's options"][-1]) == legacy
    assert sections["options"] == ["-h, --help", "--version"]
    assert sections["large jobs"] == ["--store-relays [auto|1|0]"]
    assert all(a.help for a in options)  # every one says what it does
    assert [g.description for g in groups if g.title == "stragglers"] == ["the rank the others keep waiting for"]


def test_an_option_under_no_heading_fails_the_parser_at_once(monkeypatch):
    groups = rankrun.cli.GROUPS
    for left_out in (("--events",), ("--standalone",), ("--events", "--standalone")):  # an option, a flag, both
        grouped = [(t, d, tuple(n for n in names if n not in left_out)) for t, d, names in groups]
        monkeypatch.setattr("rankrun.cli.GROUPS", grouped)
        with pytest.raises(AssertionError, match=rf"^options under no --help heading: {re.escape(str(list(left_out)))}$"):
            build_parser({})


def test_help_shows_one_spelling_and_both_parse(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    invocations = [line for lines in _sections(build_parser({}).format_help()).values() for line in lines]
    assert [line for line in invocations if "_" in line] == []  # torchrun's underscore twins: parsed, not listed
    assert "--nproc-per-node N" in invocations
    # a short and a long spelling: both shown (argparse names the value once from Python 3.13 on)
    assert {"-r MAP, --redirects MAP", "-r, --redirects MAP"} & set(invocations)
    dashes = parse_args(["--nproc-per-node", "2", "--max-restarts", "1", "t.py"], {})
    underscores = parse_args(["--nproc_per_node", "2", "--max_restarts", "1", "t.py"], {})
    assert (dashes.nproc_per_node, dashes.max_restarts) == (underscores.nproc_per_node, underscores.max_restarts) == ("2", 1)


KNOWN = ["-h", "--help", "-m", "--module", "--nproc-per-node", "--nproc_per_node", "--max-restarts", "--max_restarts"]


@pytest.mark.parametrize(("unknown", "line"), [
    (["--nprocs-per-node"], "unknown option --nprocs-per-node (did you mean --nproc-per-node?)"),
    (["--nprocs_per_node=4"], "unknown option --nprocs_per_node (did you mean --nproc_per_node?)"),  # the value: not
    (["--bogus"], "unknown option --bogus (--help lists the options)"),
    (["-x"], "unknown option -x (--help lists the options)"),
    (["--max-restart-count", "--zzz"], "unknown options --max-restart-count (did you mean --max-restarts?), --zzz"),
])
def test_an_unknown_option_is_named_with_the_closest_real_one(unknown, line):
    assert unknown_options(unknown, KNOWN) == line


def test_a_mistyped_option_before_the_script_is_refused_and_after_it_is_the_scripts():
    with pytest.raises(ArgumentError, match=r"^unknown option --nprocs-per-node \(did you mean --nproc-per-node\?\)$"):
        parse_args(["--nprocs-per-node", "2", "t.py"], {})
    for legacy in (False, True):  # torchrun's way: everything after the script is the script's own
        ns = parse_args(["--nproc-per-node", "2", "t.py", "--nprocs-per-node", "3", "--bogus"], {}, legacy=legacy)
        assert (ns.nproc_per_node, ns.training_script, ns.training_script_args) == (
            "2", "t.py", ["--nprocs-per-node", "3", "--bogus"])
    assert parse_args(["--max-restart", "1", "t.py"], {}).max_restarts == 1  # a unique prefix is torchrun's too


def test_no_script_and_no_typo_is_still_the_missing_script():
    for argv in ([], ["-m"], ["--standalone", "--no-python"]):
        with pytest.raises(ArgumentError, match=r"^missing training script"):
            parse_args(argv, {})
    with pytest.raises(ArgumentError, match=r"^unknown option --hlep \(did you mean --help\?\)$"):
        parse_args(["--hlep"], {})
