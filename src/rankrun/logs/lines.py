"""Pure byte handling for worker output: prefixing as a state machine, holding partial lines, a tail.

No I/O here. Worker bytes are passed on as they come (a progress bar redrawn with ``\\r`` must
move, a prompt without a newline must show): the only bytes rankrun ever adds are the rank
prefix, at the start of each console line and after each ``\\r`` redraw, and the newline that
ends another rank's open line before a different source writes (see ``rankrun.logs.console``).
The hot path works on whole chunks (one ``replace``), not line by line.
"""

from __future__ import annotations

import enum
import re
from string import Template

HOLD_MAX = 1 << 16  # a held partial line longer than this is passed on at once (memory stays bounded)

# where a prefix goes inside a chunk: after \n, and after a redraw's \r (not the \r of \r\n, nor one before another \r)
_LINE_START = re.compile(rb"\n(?=[\s\S])|\r(?=[^\n\r])")


class LineState(enum.Enum):
    """Where a source's console line stands after the bytes rendered so far."""

    FRESH = "fresh"  # at the start of a line: the prefix goes before the next byte
    MID = "mid"  # inside a line (open on the console)
    AFTER_CR = "after_cr"  # the last byte was \r: a redraw (prefix next) unless \n follows
    ENDED = "ended"  # the console ended this open line itself: a newline that follows is already shown

    @property
    def open(self) -> bool:
        return self in (LineState.MID, LineState.AFTER_CR)


def end_state(data: bytes) -> LineState:
    last = data[-1:]
    if last == b"\n":
        return LineState.FRESH
    return LineState.AFTER_CR if last == b"\r" else LineState.MID


def render(data: bytes, prefix: bytes, state: LineState) -> tuple[bytes, LineState]:
    """``data`` as the console shows it after ``state``, and the state after it.

    The prefix goes at the start of every line and after every ``\\r`` that is not part of
    ``\\r\\n``; a ``\\r`` at the end of ``data`` waits for the next byte to decide. After
    ``ENDED`` a leading newline is dropped: the console already ended that line.
    """
    if state is LineState.ENDED:
        if data.startswith(b"\n"):
            data = data[1:]
        elif data.startswith(b"\r\n"):
            data = data[2:]
        state = LineState.FRESH
    if not data:
        return b"", state
    end = end_state(data)
    if not prefix:
        return data, end
    redraw = state is LineState.AFTER_CR and data[0] not in (0x0A, 0x0D)  # the \r was a redraw, not \r\n
    head = prefix if state is LineState.FRESH or redraw else b""
    if b"\r" in data:  # a line starts after \n, and a redraw after a \r that is not part of \r\n
        body = _LINE_START.sub(lambda m: m.group(0) + prefix, data)
    else:  # the hot path: one replace
        body = data.replace(b"\n", b"\n" + prefix)
        if end is LineState.FRESH:
            body = body[: -len(prefix)]  # the next line's prefix comes with its first byte
    return head + body, end


def split_complete(data: bytes) -> tuple[bytes, bytes]:
    """(complete lines, the partial line after the last newline)."""
    cut = data.rfind(b"\n") + 1
    return data[:cut], data[cut:]


def render_prefix(template: str, *, role: str, rank: int, local_rank: int) -> bytes:
    """``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE`` semantics (``string.Template``, unknown names kept)."""
    text = Template(template).safe_substitute(role_name=role, rank=rank, local_rank=local_rank)
    return text.encode()


def prefix_lines(lines: bytes, prefix: bytes) -> bytes:
    """Put ``prefix`` before every line of ``lines`` (complete lines only)."""
    if not prefix or not lines:
        return lines
    return prefix + lines[:-1].replace(b"\n", b"\n" + prefix) + b"\n"


def matching_lines(lines: bytes, needles: tuple[bytes, ...]) -> bytes:
    """The lines (of complete ``lines``) that contain any of ``needles``."""
    picked = [line for line in lines.split(b"\n")[:-1] if any(n in line for n in needles)]
    return b"".join(line + b"\n" for line in picked)


class LineSplitter:
    """Feeds arbitrary chunks, returns only complete lines; for the duplicate-filter files only.

    A partial line longer than ``max_line`` is emitted as a line of its own, so memory stays
    bounded; the console and the per-rank files never go through this.
    """

    def __init__(self, max_line: int = 1 << 20) -> None:
        self._partial = bytearray()
        self._max_line = max_line

    def feed(self, chunk: bytes) -> bytes:
        cut = chunk.rfind(b"\n")
        if cut < 0:
            self._partial += chunk
            if len(self._partial) < self._max_line:
                return b""
            return self.flush()
        if self._partial:
            self._partial += chunk[: cut + 1]
            whole = bytes(self._partial)
        else:
            whole = chunk[: cut + 1]
        self._partial = bytearray(chunk[cut + 1 :])
        return whole

    def flush(self) -> bytes:
        """The held partial line, completed with a newline (end of stream, or too long)."""
        rest, self._partial = bytes(self._partial), bytearray()
        return rest + b"\n" if rest else b""


class Tail:
    """The last ``limit`` bytes of a stream, for failure reports."""

    def __init__(self, limit: int = 64 * 1024) -> None:
        self._limit = limit
        self._chunks: list[bytes] = []
        self._size = 0

    def add(self, data: bytes) -> None:
        self._chunks.append(data)
        self._size += len(data)
        while self._size - len(self._chunks[0]) >= self._limit and len(self._chunks) > 1:
            self._size -= len(self._chunks.pop(0))

    def text(self) -> str:
        data = b"".join(self._chunks)[-self._limit :]
        return data.decode(errors="replace")
