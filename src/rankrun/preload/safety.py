"""Whether the preloading process may fork now: it must hold no other thread, no socket but its control socket, and
no GPU context, or a forked worker inherits a state that cannot work (``shared/reference/recovery.md``, §1):

- a thread: a fork copies only the forking thread, so a lock another thread held stays held in the child, and a pool
  the child believes it has is gone (a libgomp pool after a parallel torch operation hangs the child's next one;
  gunicorn#2478, pytorch#49555). Pools that take themselves down at a fork (OpenBLAS's, which ``import numpy``
  starts) are gone after the one throwaway fork ``server`` makes after the imports, so the only count accepted is 1;
- a socket: a connection the children share (a store connection: children of a process that held one hung in gloo's
  set-up), or a server a module started at import;
- CUDA: a CUDA context does not survive a fork (torch marks the child "bad fork" and refuses; vLLM and sglang fixed
  exactly this), nor does a driver handle on ``/dev/nvidia*``, ``/dev/kfd`` or ``/dev/dri``.

``facts`` reads them (about 50 µs of ``/proc``); ``verdict`` is the pure rule.
"""

from __future__ import annotations

import os
import sys

from rankrun.record import record

GPU_DEVICES = ("/dev/nvidia", "/dev/kfd", "/dev/dri/")


@record
class Facts:
    threads: int  # OS threads of the process (``/proc/self/task``)
    thread_names: tuple[str, ...]  # the Python threads but the main one, by name
    sockets: int  # sockets held besides the control socket
    gpu_files: tuple[str, ...]  # open descriptors on a GPU driver's device
    cuda: bool  # torch's CUDA is initialised


def facts(control: int) -> Facts:
    """The process as it is now; ``control``: the control socket's descriptor, which does not count."""
    sockets, gpu = 0, []
    for name in os.listdir("/proc/self/fd"):
        if int(name) == control:
            continue
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # the listing's own descriptor, closed by now
        if target.startswith("socket:"):
            sockets += 1
        elif target.startswith(GPU_DEVICES):
            gpu.append(target)
    threading = sys.modules.get("threading")
    names = tuple(t.name for t in threading.enumerate() if t is not threading.main_thread()) if threading else ()
    cuda = sys.modules.get("torch.cuda")
    initialised = getattr(cuda, "is_initialized", None)
    return Facts(len(os.listdir("/proc/self/task")), names, sockets, tuple(sorted(set(gpu))),
                 bool(initialised()) if callable(initialised) else False)


def verdict(f: Facts) -> str | None:
    """Why a fork now would hand the worker a broken state, in words for the user's line; ``None``: safe."""
    if f.cuda:
        return "torch has initialised CUDA (a CUDA context cannot be forked)"
    if f.gpu_files:
        return f"it holds the GPU driver open ({', '.join(f.gpu_files[:3])})"
    if f.threads > 1:
        named = f" ({', '.join(repr(n) for n in f.thread_names[:3])})" if f.thread_names else ""
        return f"it has {f.threads} threads{named}: a module started a thread at import"
    if f.sockets:
        return f"it holds {f.sockets} socket{'s' if f.sockets > 1 else ''}: a module opened one at import"
    return None
