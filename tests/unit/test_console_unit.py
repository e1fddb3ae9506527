"""The console's rules on real fds (files): open lines, one destination or two, the epilogue last."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from rankrun.logs.console import Console, same_destination


def _run(tmp_path: Path, merged: bool, script) -> tuple[bytes, bytes]:
    out_path, err_path = tmp_path / "out", tmp_path / "err"
    with out_path.open("wb") as out, err_path.open("wb") as err:
        console = Console(out.fileno(), err.fileno(), merged=merged)
        asyncio.run(asyncio.wait_for(script(console), 30))
        console.close()
    return out_path.read_bytes(), err_path.read_bytes()


def test_another_source_ends_an_open_line_which_resumes_under_its_prefix(tmp_path):
    async def script(console: Console) -> None:
        a, b = console.source(console.stdout_fd, b"[a]"), console.source(console.stdout_fd, b"[b]")
        await a.write(b"loading")
        await b.write(b"ready\n")
        await a.write(b" done\nnext")
        await b.write(b"\r 50%")

    out, _ = _run(tmp_path, merged=False, script=script)
    assert out == b"[a]loading\n[b]ready\n[a] done\n[a]next\n[b]\r[b] 50%\n"  # the last open line is ended at close


def test_a_raw_open_line_is_left_as_the_worker_wrote_it(tmp_path):
    async def script(console: Console) -> None:
        await console.source(console.stdout_fd, b"").write(b"no newline")

    assert _run(tmp_path, merged=False, script=script) == (b"no newline", b"")


def test_merged_destination_keeps_order_and_agent_lines_end_open_lines(tmp_path):
    async def script(console: Console) -> None:
        out, err = console.source(console.stdout_fd, b""), console.source(console.stderr_fd, b"")
        await out.write(b"o1\n")
        await err.write(b"e1\n")
        await out.write(b"prompt> ")
        console.say("received SIGINT")
        console.set_epilogue(b"REPORT\n")

    out, err = _run(tmp_path, merged=True, script=script)
    assert out == b"o1\ne1\nprompt> \nrankrun: received SIGINT\nREPORT\n"
    assert err == b""


def test_epilogue_comes_after_everything_on_both_destinations(tmp_path):
    async def script(console: Console) -> None:
        out = console.source(console.stdout_fd, b"")
        for i in range(2000):
            await out.write(b"line %d\n" % i)
        console.set_epilogue(b"REPORT\n")

    out, err = _run(tmp_path, merged=False, script=script)
    assert out.count(b"\n") == 2000 and err == b"REPORT\n"


def test_same_destination(tmp_path):
    path = tmp_path / "f"
    with path.open("wb") as a, path.open("ab") as b, (tmp_path / "g").open("wb") as c:
        assert same_destination(a.fileno(), b.fileno())
        assert not same_destination(a.fileno(), c.fileno())


def test_written_waits_until_the_bytes_left_for_their_destination_not_only_the_queue():
    """An interactive worker's terminal gets the user's modes back right after ``written()``: until then the bytes
    must have been written, not merely queued (a writer thread blocked on a slow console holds them)."""
    read_end, write_end = os.pipe()
    fill = b"x" * 65536  # a Linux pipe's whole buffer: the writer thread blocks on what follows
    try:
        console = Console(write_end, write_end, merged=True)

        async def script() -> tuple[bool, bytes]:
            source = console.source(console.stdout_fd, b"")
            await source.write(fill)
            await source.write(b"last line\n")
            waiting = asyncio.ensure_future(console.written())
            await asyncio.sleep(0.2)  # the point: with nobody reading, it must still be waiting
            early = waiting.done()
            got = b""
            while not got.endswith(b"last line\n"):
                got += await asyncio.to_thread(os.read, read_end, 1 << 16)
            await asyncio.wait_for(waiting, 10)
            return early, got

        early, got = asyncio.run(asyncio.wait_for(script(), 30))
        console.close()
        assert not early
        assert got == fill + b"last line\n"
    finally:
        os.close(read_end)
        os.close(write_end)
