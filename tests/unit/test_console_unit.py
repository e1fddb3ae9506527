"""The console's rules on real fds (files): open lines, one destination or two, the epilogue last."""

from __future__ import annotations

import asyncio
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
