"""Pure line handling: cut a byte stream into whole lines, prefix them, keep a tail.

No I/O here. The hot path works on whole chunks (one ``rfind``, one ``replace``) rather
than line by line, so the agent keeps up with workers printing at full speed.
"""

from __future__ import annotations

from string import Template

MAX_LINE = 1 << 20  # a "line" longer than this is cut (with a newline) rather than held in memory


class LineSplitter:
    """Feeds arbitrary chunks, returns only complete lines (each ending in ``\\n``).

    A partial line is held until its newline arrives, up to ``max_line`` bytes; past that it
    is emitted as a line of its own, so a worker printing megabytes without a newline costs
    bounded memory and linear time.
    """

    def __init__(self, max_line: int = MAX_LINE) -> None:
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
        """The held partial line, given a newline so it cannot glue to another (end of stream, or too long)."""
        rest, self._partial = bytes(self._partial), bytearray()
        return rest + b"\n" if rest else b""


def prefix_lines(lines: bytes, prefix: bytes) -> bytes:
    """Put ``prefix`` before every line of ``lines`` (complete lines only)."""
    if not prefix or not lines:
        return lines
    return prefix + lines[:-1].replace(b"\n", b"\n" + prefix) + b"\n"


def render_prefix(template: str, *, role: str, rank: int, local_rank: int) -> bytes:
    """``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE`` semantics (``string.Template``, unknown names kept)."""
    text = Template(template).safe_substitute(role_name=role, rank=rank, local_rank=local_rank)
    return text.encode()


def matching_lines(lines: bytes, needles: tuple[bytes, ...]) -> bytes:
    """The lines that contain any of ``needles``."""
    picked = [line for line in lines.split(b"\n")[:-1] if any(n in line for n in needles)]
    return b"".join(line + b"\n" for line in picked)


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
