"""``python -m rankrun.timeline`` in a real process, its page opened by a real headless Chromium (Debian's ``chromium``).

Chromium runs with its own profile, home and temp directory under the test's tmp_path, in a session of its own: it is
killed by its process group if it outlives its bound, and the crash handlers it starts in sessions of their own (their
command lines name this test's home) must be gone after it.
"""

from __future__ import annotations

import contextlib
import html
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from collections import Counter
from pathlib import Path

import pytest

import timeline_events as job
from conftest import alive, clean_environ, payload, run_cli
from rankrun.events.goodput import PARTS as GOODPUT_PARTS
from rankrun.timeline.layout import layout
from rankrun.timeline.read import read_file
from rankrun.timeline.render import PART_COLORS

CHROMIUM = shutil.which("chromium")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (scripts/test installs it: apt-get install chromium)")
CHROMIUM_BOUND = 90.0  # seconds; it takes about 1 s on an idle machine


def timeline(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**clean_environ(), "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    return subprocess.run([sys.executable, "-m", "rankrun.timeline", *map(str, args)], env=env, capture_output=True,
                          text=True, timeout=60, check=False)


def _ours(marker: str) -> list[int]:
    """Processes whose command line names ``marker`` (this test's own directory): Chromium's crash handlers."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if marker.encode() in (entry / "cmdline").read_bytes() and alive(int(entry.name)):
                    found.append(int(entry.name))
    return found


def chromium(tmp_path: Path, uri: str, *args: str) -> str:
    """Run headless Chromium on ``uri`` (bounded), leave nothing of it running, return its stdout."""
    home = tmp_path / "chromium-home"
    home.mkdir(exist_ok=True)
    # its singleton socket lives in TMPDIR, and a socket's path must be short (108 bytes): a fresh directory in /tmp
    with tempfile.TemporaryDirectory(prefix="rrc-", dir="/tmp") as tmp:
        env = {**clean_environ(), "HOME": str(home), "TMPDIR": tmp, "XDG_CONFIG_HOME": str(home / ".config"),
               "XDG_CACHE_HOME": str(home / ".cache")}
        return _run_chromium(env, home, uri, *args)


def _run_chromium(env: dict[str, str], home: Path, uri: str, *args: str) -> str:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={home / 'profile'}", "--no-first-run",
           "--disable-extensions", *args, uri]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=CHROMIUM_BOUND)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"chromium did not finish within {CHROMIUM_BOUND} s")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # its zygotes and renderers, should any outlive it
        deadline = time.monotonic() + 10
        while (left := _ours(str(home))) and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-2000:]
    assert not left, f"chromium left processes behind: {left}"
    return out


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and the unfiltered rows of an 8-bit RGB or RGBA PNG (decoded by hand: no image library here)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, chunks = 8, {}
    idat = b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        assert zlib.crc32(kind + body) == struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])[0], kind
        if kind == b"IDAT":
            idat += body
        chunks.setdefault(kind, body)
        pos += 12 + length
    width, height, depth, color = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert (depth, color) in ((8, 2), (8, 6)), (depth, color)
    bpp = 3 if color == 2 else 4
    raw, stride = zlib.decompress(idat), width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + b) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        rows.append(bytes(line))
        prev = line
    return width, height, [bytes(r[i : i + 3]) for r in rows for i in range(0, stride, bpp)]


@pytest.fixture
def page(tmp_path: Path) -> Path:
    paths = job.write_job(tmp_path, exception="ValueError: bad lr <script>alert(1)</script>")
    out = tmp_path / "job.html"
    done = timeline(*paths, "-o", out)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"rankrun.timeline: wrote {out} (27 events, 2 lanes)\n"
    return out


@needs_chromium
def test_the_page_fetches_nothing_and_names_the_run_the_failure_and_the_restart_once_rendered(tmp_path, page):
    html = page.read_text()
    assert not re.search(r"""\b(src|href)\s*=\s*["']?\s*(https?:)?//""", html, re.IGNORECASE)
    assert not re.search(r"\b(src|href)\s*=", html, re.IGNORECASE)  # nothing to load at all: all of it is inline
    assert "url(" not in html

    dom = chromium(tmp_path, page.as_uri(), "--dump-dom")
    assert f'<code id="run">{job.RUN}</code>' in dom
    assert "restart → attempt 1 (2 left)" in dom
    assert "attempt 0: rank 1 failed: ValueError: bad lr &lt;script&gt;alert(1)&lt;/script&gt; on 127.0.0.2" in dom
    assert dom.count("<script>") == 1  # the page's own: the exception's stayed text
    assert "lost: 127.0.0.4" in dom
    assert "stall: ranks 3" in dom
    # the job's goodput in the header, and each node's account as one bar of its parts (a node with no stall: five)
    assert ('<p id="goodput">goodput 26.8 % of 19.1 s (the job, 2 nodes; the worst: 127.0.0.3) — start-up 4.2 %,'
            " restarts 17.3 % (1), stalls 21.0 %, lost 25.7 %, waiting 4.9 %; nothing was kept") in dom
    parts = re.findall(r'<rect class="part" data-part="([a-z]+)"[^>]*><title>([^<]*)</title>', dom)
    assert [name for name, _ in parts] == [*GOODPUT_PARTS[:4], "lost", *GOODPUT_PARTS]
    assert ("stall", "stall 4.00 s · 21.0 % of 19.0 s") in parts


@needs_chromium
def test_the_panel_shows_a_marks_event(tmp_path, page):
    """The page's script at work: ``#mark-N`` shows the N-th mark's event in the panel, as hovering it does."""
    dom = chromium(tmp_path, page.as_uri(), "--dump-dom")
    captions = re.findall(r'data-caption="([^"]*)"', dom)
    n = next(i for i, c in enumerate(captions) if c.startswith("stall · ") and c.endswith("node-b.jsonl:12"))
    assert re.search(r'<p id="caption">the root cause · ', dom)

    dom = chromium(tmp_path, f"{page.as_uri()}#mark-{n}", "--dump-dom")
    assert re.search(r'<p id="caption">stall · [^<]*node-b.jsonl:12</p>', dom)
    shown = re.search(r'<pre id="event">([^<]*)</pre>', dom)
    assert shown is not None
    assert json.loads(html.unescape(shown.group(1))) == job.node_events(job.B)[11]
    assert len(re.findall(r'class="[^"]*\bhot\b', dom)) == 1  # the mark shown is the one highlighted
    assert re.search(r'<g class="mark hot"[^>]*data-caption="stall · [^"]*node-b.jsonl:12"', dom)


@needs_chromium
def test_a_screenshot_is_a_picture(tmp_path, page):
    shot = tmp_path / "shot.png"
    chromium(tmp_path, page.as_uri(), f"--screenshot={shot}", "--window-size=1200,600", "--hide-scrollbars",
             "--run-all-compositor-stages-before-draw")  # all of it painted before the picture is taken
    width, height, pixels = png_pixels(shot.read_bytes())
    assert (width, height) == (1200, 600)
    colors = Counter(pixels)
    assert len(colors) > 50  # text, bars, marks: not one flat color

    def share(wanted) -> int:
        return sum(n for c, n in colors.items() if wanted(c[0], c[1], c[2]))

    assert share(lambda r, g, b: (r, g, b) != (255, 255, 255)) > width * height // 10  # more than a blank page
    assert share(lambda r, g, b: r > 180 and g < 90 and b < 90) > 2000  # the failed attempt's bar (and its mark)
    assert share(lambda r, g, b: g > 130 and r < 80 and b < 120) > 5000  # the successful attempts' bars
    # each node's goodput bar, on screen: its productive part (9.1 s and 5.11 s of the 19.1 s plot, 9 px high) and its
    # lost one (4.9 s each)
    for part, least in (("productive", 3500), ("lost", 2500)):
        want = bytes.fromhex(PART_COLORS[part][1:])
        assert share(lambda r, g, b, want=want: max(abs(r - want[0]), abs(g - want[1]), abs(b - want[2])) <= 8) > least


def test_bad_input_is_one_line_and_exit_2_in_a_real_process(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(job.node_events(job.A)[0]) + "\nnot json\n")
    done = timeline(bad, "-o", tmp_path / "out.html")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"rankrun.timeline: {bad}:2: not JSON (Expecting value)\n"
    assert not (tmp_path / "out.html").exists()


def test_the_header_is_the_jobs_ending_whatever_the_order_of_the_files_in_a_real_process(tmp_path):
    # the node the job excluded exited 4 at once; the job went on and succeeded on the other two
    a, b = job.write_job(tmp_path)
    excluded = job.write(tmp_path / "node-x.jsonl", job.excluded_events())
    headers = []
    for n, order in enumerate(([excluded, a, b], [a, b, excluded])):
        out = tmp_path / f"job-{n}.html"
        done = timeline(*order, "-o", out)
        assert (done.returncode, done.stderr) == (0, "")
        headers.append(re.search(r'<p id="summary"><b>(.*?)</b></p>', out.read_text()).group(1))
    assert headers[0] == headers[1]
    assert html.unescape(headers[0]).endswith(" · succeeded (exit 0) after 19.1 s; excluded, exit 4: 127.0.0.5")


def test_a_preload_jobs_file_is_drawn_in_a_real_process(tmp_path):
    """A ``--preload`` job's preload and warm events, as the launcher writes them, read back and drawn: each attempt
    forked or cold, the one import a bar, the preloading process's end a mark."""
    events = job.write(tmp_path / "warm.jsonl", job.warm_events())
    done = timeline(events)
    out = tmp_path / "warm.html"
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"rankrun.timeline: wrote {out} (20 events, 1 lane)\n"
    text = html.unescape(out.read_text())
    for words in ("attempt 0 · ranks 0-1 · forked · failed", "attempt 2 · ranks 0-1 · cold · succeeded",
                  "import torch 2.31 s", "preload ended, workers cold: killed by SIGKILL"):
        assert f"<title>{words}</title>" in text, words


def test_a_real_launchers_file_is_accounted_and_agrees_with_its_job_end_within_one_percent_of_wall(tmp_path):
    """A real launcher's events file (rank 1 raises on attempt 0, the job restarts and succeeds): the page folds the
    node's account from its events, and the launcher's own account in ``job.end`` (the same fold, at the job's end)
    agrees with it within 1 % of the wall time."""
    events = tmp_path / "events.jsonl"
    done = run_cli("--nproc-per-node", "2", "--max-restarts", "1", "--events", str(events), payload("events_worker.py"),
                   env={**clean_environ(), "FAIL_RANK": "1"}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    [lane] = layout(read_file(str(events))).lanes
    drawn = lane.account
    assert drawn is not None
    # each part is rounded to the millisecond: six of them may be 3 ms off a wall time of 80 ms
    assert sum(p.seconds for p in lane.parts) == pytest.approx(drawn.wall_s, abs=max(0.01 * drawn.wall_s, 0.0035))
    assert (drawn.restart_s > 0, drawn.lost_s > 0, drawn.productive_s > 0) == (True, True, True)
    written = [json.loads(line) for line in events.read_text().splitlines()][-1]["goodput"]
    off = {name: abs(getattr(drawn, name) - value) for name, value in written.items()}
    assert all(d <= max(0.01 * drawn.wall_s, 0.0015) for d in off.values()), (written, drawn)
