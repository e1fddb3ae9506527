"""Whether the preloading process may fork (``rankrun.preload.safety``): ``verdict``'s words for each cause and their
order, and ``facts`` read from a real process that started a thread, opened a socket or "initialised CUDA"."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rankrun.preload.safety import GPU_DEVICES, Facts, facts, verdict

FIELDS = ("threads", "thread_names", "sockets", "gpu_files", "cuda")


def _facts(threads: int = 1, thread_names: tuple[str, ...] = (), sockets: int = 0, gpu_files: tuple[str, ...] = (),
           cuda: bool = False) -> Facts:
    return Facts(threads, thread_names, sockets, gpu_files, cuda)


@pytest.mark.parametrize(("f", "why"), [
    (_facts(), None),
    (_facts(cuda=True), "torch has initialised CUDA (a CUDA context cannot be forked)"),
    (_facts(gpu_files=("/dev/nvidia0",)), "it holds the GPU driver open (/dev/nvidia0)"),
    (_facts(gpu_files=("/dev/dri/renderD128", "/dev/kfd", "/dev/nvidia0", "/dev/nvidiactl")),
     "it holds the GPU driver open (/dev/dri/renderD128, /dev/kfd, /dev/nvidia0)"),  # three at most
    (_facts(threads=2), "it has 2 threads: a module started a thread at import"),
    (_facts(threads=2, thread_names=("sleeper",)), "it has 2 threads ('sleeper'): a module started a thread at import"),
    (_facts(threads=5, thread_names=("a", "b", "c", "d")),
     "it has 5 threads ('a', 'b', 'c'): a module started a thread at import"),
    (_facts(threads=1, thread_names=("registered, not running",)), None),  # the OS's count decides
    (_facts(sockets=1), "it holds 1 socket: a module opened one at import"),
    (_facts(sockets=2), "it holds 2 sockets: a module opened one at import"),
    (_facts(threads=0), None),  # (cannot happen; not "unsafe" either)
])
def test_verdict(f, why):
    assert verdict(f) == why


def test_verdict_says_the_worst_cause_first():
    """CUDA, then the driver's files (what CUDA leaves), then threads, then sockets: one cause in the line."""
    every = {"threads": 3, "thread_names": ("t",), "sockets": 2, "gpu_files": ("/dev/nvidia0",), "cuda": True}
    assert verdict(_facts(**every)) == "torch has initialised CUDA (a CUDA context cannot be forked)"
    assert verdict(_facts(**every | {"cuda": False})) == "it holds the GPU driver open (/dev/nvidia0)"
    assert verdict(_facts(**every | {"cuda": False, "gpu_files": ()})) == ("it has 3 threads ('t'): a module started a "
                                                                           "thread at import")
    assert verdict(_facts(**every | {"cuda": False, "gpu_files": (), "threads": 1})) == ("it holds 2 sockets: a module "
                                                                                        "opened one at import")


def test_the_gpu_devices():
    assert GPU_DEVICES == ("/dev/nvidia", "/dev/kfd", "/dev/dri/")


# Each runs in a fresh interpreter: what it sets up, then facts(control) printed as JSON. ``control`` is one end of a
# socket pair, as the preloading process's is: it does not count, its peer does.
PROLOGUE = """\
import json, socket, sys
from rankrun.preload.safety import facts
control, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
peer.close()
"""
CASES = {
    "nothing": ("", {"threads": 1, "thread_names": [], "sockets": 0, "gpu_files": [], "cuda": False}),
    "a thread": ("import threading, time\n"
                 "threading.Thread(target=time.sleep, args=(60,), name='sleeper', daemon=True).start()\n",
                 {"threads": 2, "thread_names": ["sleeper"], "sockets": 0, "gpu_files": [], "cuda": False}),
    "a _thread": ("import _thread, time\n_thread.start_new_thread(time.sleep, (60,))\n",
                  {"threads": 2, "thread_names": [], "sockets": 0, "gpu_files": [], "cuda": False}),
    "a listening socket": ("server = socket.create_server(('127.0.0.1', 0))\n",
                           {"threads": 1, "thread_names": [], "sockets": 1, "gpu_files": [], "cuda": False}),
    # past the descriptor that listing /proc/self/fd uses (the lowest free one, gone when read): still counted
    "a socket past a free descriptor": ("hole = open(sys.executable, 'rb')\n"
                                        "server = socket.create_server(('127.0.0.1', 0))\nhole.close()\n",
                                        {"threads": 1, "thread_names": [], "sockets": 1, "gpu_files": [],
                                         "cuda": False}),
    "two sockets": ("pair = socket.socketpair()\n",
                    {"threads": 1, "thread_names": [], "sockets": 2, "gpu_files": [], "cuda": False}),
    "torch with CUDA": ("import types\ncuda = types.ModuleType('torch.cuda')\ncuda.is_initialized = lambda: True\n"
                        "sys.modules['torch.cuda'] = cuda\n",
                        {"threads": 1, "thread_names": [], "sockets": 0, "gpu_files": [], "cuda": True}),
    "torch without CUDA": ("import types\ncuda = types.ModuleType('torch.cuda')\ncuda.is_initialized = lambda: 0\n"
                           "sys.modules['torch.cuda'] = cuda\n",
                           {"threads": 1, "thread_names": [], "sockets": 0, "gpu_files": [], "cuda": False}),
    "torch.cuda without is_initialized": ("import types\ncuda = types.ModuleType('torch.cuda')\n"
                                          "cuda.is_initialized = True\nsys.modules['torch.cuda'] = cuda\n",
                                          {"threads": 1, "thread_names": [], "sockets": 0, "gpu_files": [], "cuda": False}),
    "a file and a pipe": ("import os\nr, w = os.pipe()\nf = open(sys.executable, 'rb')\n",
                          {"threads": 1, "thread_names": [], "sockets": 0, "gpu_files": [], "cuda": False}),
}
EPILOGUE = f"""\
FIELDS = {FIELDS!r}
f = facts(control.fileno())
print(json.dumps({{name: getattr(f, name) for name in FIELDS}}))
"""


@pytest.mark.parametrize("case", CASES)
def test_facts_of_a_real_process(case):
    setup, expected = CASES[case]
    done = subprocess.run([sys.executable, "-c", PROLOGUE + setup + EPILOGUE], capture_output=True, text=True,
                          timeout=60, check=True)
    assert json.loads(done.stdout) == expected, done.stderr


def test_facts_without_threading_loaded():
    """A process where ``threading`` was never imported (as ``python -S`` with a module that needs no thread) has no
    thread names, and one thread: ``facts`` reads ``sys.modules`` at the call, so taking it out shows that."""
    code = ("import json, sys\nfrom rankrun.preload.safety import facts\n"
            "sys.modules.pop('threading', None)\n"
            f"f = facts(-1)\nprint(json.dumps({{name: getattr(f, name) for name in {FIELDS!r}}}))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(done.stdout) == {"threads": 1, "thread_names": [], "sockets": 0, "gpu_files": [], "cuda": False}


def test_facts_in_this_process_counts_its_threads():
    import threading  # noqa: PLC0415

    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="waiter")
    thread.start()
    try:
        f = facts(-1)
        assert f.threads >= 2 and "waiter" in f.thread_names and "MainThread" not in f.thread_names
        assert "it has" in (verdict(f) or "")
    finally:
        stop.set()
        thread.join(10)


def test_facts_name_the_gpu_drivers_files_held_open():
    """Only where an NVIDIA driver is installed (none on the machines without a GPU): its control device held open
    is named, as the driver's handles a CUDA context leaves behind would be."""
    try:
        fd = os.open("/dev/nvidiactl", os.O_RDONLY)
    except OSError as exc:
        pytest.skip(f"no NVIDIA driver's device to hold open: {exc.strerror}")
    try:
        f = facts(-1)
        assert "/dev/nvidiactl" in f.gpu_files and list(f.gpu_files) == sorted(set(f.gpu_files))
        assert verdict(_facts(gpu_files=f.gpu_files)) == f"it holds the GPU driver open ({', '.join(f.gpu_files[:3])})"
    finally:
        os.close(fd)
