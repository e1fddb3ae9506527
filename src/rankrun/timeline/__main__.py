"""The command line: read the event files, lay them out, write the page; bad input is one line on stderr and exit 2."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

from rankrun.errors import EXIT_SUCCESS, EXIT_USAGE
from rankrun.timeline.layout import layout
from rankrun.timeline.read import BadInput, one_run, read_file
from rankrun.timeline.render import PLOT_W, page

PROG = "python -m rankrun.timeline"


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (through BadInput), never the usage block."""

    def error(self, message: str) -> NoReturn:
        raise BadInput(f"{message} (usage: {PROG} EVENTS... [-o OUT.html] [--run RUN])")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Draw a job from its nodes' --events files as one self-contained HTML page.",
                     epilog="exit codes: 0 the page written, 2 bad input (one line on stderr names the file and line)")
    parser.add_argument("events", nargs="+", metavar="EVENTS", help="event files (JSON lines, schema 1), one per node")
    parser.add_argument("-o", "--output", metavar="OUT.html",
                        help="the page to write (default: the first EVENTS file's name with .html)")
    parser.add_argument("--run", help="the run to draw when the files hold more than one (they are appended to)")
    return parser


def default_output(first: str) -> Path:
    """``job.jsonl`` -> ``job.html``, next to it (never the input itself)."""
    path = Path(first)
    return path.with_suffix(".html") if path.suffix != ".html" else path.with_name(path.name + ".html")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
        events = one_run([e for path in args.events for e in read_file(path)], args.run)
        out = Path(args.output) if args.output else default_output(args.events[0])
        html = page(layout(events, PLOT_W))
        try:
            out.write_text(html, encoding="utf-8")
        except OSError as err:
            raise BadInput(f"-o {out}: cannot write: {err.strerror or err}") from None
    except BadInput as err:
        print(f"rankrun.timeline: {err}", file=sys.stderr)
        return EXIT_USAGE
    nodes = len({(e.source, e.node) for e in events})
    print(f"rankrun.timeline: wrote {out} ({_count(len(events), 'event')}, {_count(nodes, 'lane')})")
    return EXIT_SUCCESS


if __name__ == "__main__":
    sys.exit(main())
