"""Which part of a failed worker's last output explains its failure (pure).

The tail is cut into *blocks*: Python tracebacks (a chain of them, joined by "During handling
of the above exception …" or "The above exception was the direct cause …"), blocks Python
itself marks as ignored ("Exception ignored in …", e.g. an atexit callback that raised after
the real error), and plain lines. Then:

- ignored blocks never count;
- the traceback that ended the process is the last one, if the process stopped soon after it
  (at most ``AFTER`` more lines: a final ``sys.exit("message")`` line or shutdown noise,
  quoted with it); a traceback followed by more is taken as one the program printed and went
  on from (``traceback.print_exc()``): the last lines are quoted instead, after a note naming
  that traceback's exception (in case it was the real one, followed by much exit noise);
- a thread's traceback keeps its "Exception in thread …" line, so it does not read as the
  main thread's;
- the same holds whatever ended the process, an exit code or a signal: torch's worker that
  raises after ``init_process_group`` often dies by SIGABRT in its teardown (``terminate called
  without an active exception`` follows the traceback), and that traceback still names the
  failure; a death by signal with no traceback just before it (an OOM kill, C++'s ``terminate
  called after …``) quotes the last lines.

"Just before" is counted in lines, not seconds (the tail has no times): a traceback the program
printed and went on from is followed by what it printed next, so it is not blamed for a later
end unless the program went silent after it.

Prefixes that torch's excepthook puts on every line (``[rank1]: ``) are kept.
"""

from __future__ import annotations

from rankrun.record import record

HEADER = "Traceback (most recent call last):"
IGNORED = "Exception ignored"
THREAD = "Exception in thread "
CHAINS = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
AFTER = 5  # lines after a traceback that still mean "it ended here"
LAST = 10  # lines quoted when no traceback explains the end
MAX_LINES = 40


@record
class Block:
    kind: str  # "traceback", "ignored" or "line"
    lines: tuple[str, ...]


def blocks(text: str) -> list[Block]:
    text = text.replace("\r\n", "\n")  # a terminal's line ends
    lines = text.rstrip("\n").split("\n") if text.strip() else []
    out: list[Block] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if IGNORED in line and not line.startswith((" ", "\t")):
            end = _traceback_end(lines, i + 1) if i + 1 < len(lines) and HEADER in lines[i + 1] else _exception_line(lines, i + 1)
            out.append(Block("ignored", tuple(lines[i:end])))
            i = end
        elif HEADER in line:
            end = _traceback_end(lines, i)
            # threading's excepthook names the thread on the line before: keep it with its traceback
            head = out.pop().lines if out and out[-1].kind == "line" and THREAD in out[-1].lines[0] else ()
            out.append(Block("traceback", (*head, *lines[i:end])))
            i = end
        else:
            out.append(Block("line", (line,)))
            i += 1
    return out


def _traceback_end(lines: list[str], start: int) -> int:
    """Index after the traceback chain whose header is ``lines[start]``."""
    prefix = lines[start][: lines[start].index(HEADER)]
    i = start + 1
    while True:
        while i < len(lines) and _body(lines[i], prefix).startswith((" ", "\t")):
            i += 1  # frames and source lines are indented
        i = min(i + 1, len(lines))  # the exception line itself
        rest = [_body(line, prefix).strip() for line in lines[i : i + 4]]
        # a chained exception: blank, the chain sentence, blank, the next header
        if len(rest) >= 4 and rest[0] == "" and rest[1] in CHAINS and rest[2] == "" and HEADER in lines[i + 3]:
            i += 4
            continue
        return i


def _exception_line(lines: list[str], start: int) -> int:
    """After an "Exception ignored in" line without a traceback: its one exception line, if any."""
    if start < len(lines) and lines[start] and not lines[start].startswith((" ", "\t")) and ":" in lines[start]:
        return start + 1
    return start


def _body(line: str, prefix: str) -> str:
    return line[len(prefix) :] if prefix and line.startswith(prefix) else line


def explain(text: str) -> str:
    """The lines of ``text`` (a worker's last output) that say why it failed; ``""`` if it wrote nothing."""
    kept = [b for b in blocks(text) if b.kind != "ignored"]
    lines = [line for b in kept for line in b.lines]
    last_tb, after = _last_traceback(kept)
    if last_tb is None:
        return _clip(_last_lines(lines, LAST))
    went_on = [line for line in after if line.strip()]
    if len(went_on) > AFTER:  # the program went on after it (a handled traceback), or a lot followed it
        note = f"(the last traceback, {len(went_on)} lines before the end, was: {_raised(kept[last_tb])})"
        return _clip([note, *_last_lines(lines, LAST)])
    return _clip([*kept[last_tb].lines, *after])


def ending_exception(text: str) -> str | None:
    """``Type: message`` of the traceback that ended the process whose last output is ``text`` (its last traceback,
    when at most ``AFTER`` lines follow it), else None: no traceback, or only one the program went on from."""
    kept = [b for b in blocks(text) if b.kind != "ignored"]
    last_tb, after = _last_traceback(kept)
    if last_tb is None or sum(1 for line in after if line.strip()) > AFTER:
        return None
    return _raised(kept[last_tb])


def _last_traceback(kept: list[Block]) -> tuple[int | None, list[str]]:
    """The index of the last traceback among ``kept``, and the lines after it."""
    last_tb = max((i for i, b in enumerate(kept) if b.kind == "traceback"), default=None)
    return last_tb, [] if last_tb is None else [line for b in kept[last_tb + 1 :] for line in b.lines]


def _raised(block: Block) -> str:
    """A traceback's exception line (its last non-blank line: there is one, the header at least)."""
    return next(line.strip() for line in reversed(block.lines) if line.strip())


def _last_lines(lines: list[str], count: int) -> list[str]:
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return lines[-count:]


def _clip(lines: list[str]) -> str:
    lines = [line.rsplit("\r", 1)[-1] for line in lines]  # a \r redraw: what a terminal would show
    if len(lines) > MAX_LINES:
        lines = [*lines[:5], f"... ({len(lines) - MAX_LINES + 5} lines omitted) ...", *lines[-(MAX_LINES - 5) :]]
    return "\n".join(lines).rstrip("\n")
