"""DCGM job mapping: a file per GPU this node's workers use, naming the job, for dcgm-exporter to label its series.

What the exporter reads (NVIDIA/dcgm-exporter, ``internal/pkg/transformation/hpc.go``: ``getGPUFiles``, ``readFile``,
``hpcMapper.Process``; the directory is ``--hpc-job-mapping-dir``, or ``DCGM_HPC_JOB_MAPPING_DIR``): at every scrape,
each regular file of the directory whose name is ``<GPU_ID>`` or ``<GPU_ID>.<GPU_INSTANCE_ID>`` (``^\\d+(\\.\\d+)?$``;
any other name is skipped, so a temp file named ``.0.xxx.tmp`` is never read), every line of it a job id; each of
that GPU's series gets one copy per line with the label ``hpc_job="<line>"``. ``GPU_ID`` is DCGM's GPU id, NVML's
index: PCI bus order, the numbers ``nvidia-smi`` shows. A file named by a UUID is never read, so a
``CUDA_VISIBLE_DEVICES`` entry given as a UUID is turned into that index here.

``DcgmMapping`` is a consumer of the event stream: on ``workers.start`` it writes one file per GPU holding the run id
(one line), on ``workers.end`` and ``job.end`` it removes them. For the launcher's death by ``kill -9`` it tells
its ``on_file`` callback (the lifetime watchdog's ``own_file``) about each file before writing it, and ``off_file``
once it is gone; this package imports nothing that does it itself.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from rankrun.events.records import JobEnd, Record, WorkersEnd, WorkersStart

ENV = "DCGM_HPC_JOB_MAPPING_DIR"  # the exporter's own variable for --hpc-job-mapping-dir
_MODE = 0o644  # the exporter usually runs as another user (root, or in its own container)


def gpu_ids(visible: str | None, nproc: int, uuids: Sequence[str] = ()) -> tuple[str | None, ...]:
    """The DCGM GPU id of each local rank's GPU, the ``LOCAL_RANK``-th of those ``CUDA_VISIBLE_DEVICES`` lists
    (``visible``; ``None``: unset, and the rank's GPU is ``LOCAL_RANK`` itself); ``None`` for a rank with no GPU
    known.

    An index entry is taken as it is: CUDA's index and NVML's agree where CUDA_DEVICE_ORDER is PCI_BUS_ID, or the
    GPUs are alike. A UUID entry (``GPU-...``, or a prefix of one, as CUDA takes it) becomes its place in ``uuids``,
    the driver's GPUs in PCI bus order (NVML's, so DCGM's); ``None`` where no single GPU matches. A MIG instance
    (``MIG-...``) is ``None``: its file would be ``<GPU_ID>.<GPU_INSTANCE_ID>``, which only NVML knows. As CUDA
    does, the list ends at its first empty or negative entry.
    """
    if visible is None:
        return tuple(str(rank) for rank in range(nproc))
    entries: list[str | None] = []
    for raw in visible.split(","):
        item = raw.strip()
        if not item or item.startswith("-"):
            break
        if item.isdigit():
            entries.append(str(int(item)))
        elif item.startswith("GPU-"):
            matches = [index for index, uuid in enumerate(uuids) if uuid.startswith(item)]
            entries.append(str(matches[0]) if len(matches) == 1 else None)
        elif item.startswith("MIG-"):
            entries.append(None)
        else:
            break
    return tuple(entries[rank] if rank < len(entries) else None for rank in range(nproc))


def _nothing(*_args: str) -> None:
    return None


class DcgmMapping:
    """This node's GPU-to-job files in ``directory``, for the workers of the attempt that runs."""

    def __init__(self, directory: str | os.PathLike[str], gpu_of_local_rank: Sequence[str | None],
                 on_file: Callable[[str, str], None] = _nothing, off_file: Callable[[str], None] = _nothing,
                 warn: Callable[[str], None] = _nothing) -> None:
        self.directory = Path(directory)
        self.gpus = tuple(gpu_of_local_rank)
        self.on_file = on_file  # (path, content): before the file is written, so a kill -9 right after leaves none
        self.off_file = off_file  # (path): once the file is gone, or is another job's
        self.warn = warn  # one console line, the first time a file cannot be written or removed
        self.written: dict[str, str] = {}  # path -> the content written: what makes it still this run's
        self._warned = False

    def on_event(self, event: Record) -> None:
        """Write the files as the workers start, remove them as they end or the job does. Other events, and a
        ``workers.start`` without a run id, are ignored: a consumer never breaks the stream that feeds it."""
        if isinstance(event, WorkersStart):
            self.remove()  # a previous attempt's, had its workers.end been missed
            self._write(event)
        elif isinstance(event, WorkersEnd | JobEnd):
            self.remove()

    def _write(self, event: WorkersStart) -> None:
        run = event.run
        if not run or "\n" in run:
            return
        workers = len(event.pids)
        content = run + "\n"  # one line: the exporter gives each line its own copy of the GPU's series
        for gpu in sorted({gpu for gpu in self.gpus[:workers] if gpu is not None}, key=int):
            path = str(self.directory / gpu)
            self.on_file(path, content)
            try:
                _write_atomically(self.directory, gpu, content)
            except OSError as error:
                self.off_file(path)
                self._warn(f"rankrun: DCGM job mapping: cannot write {path}: {error.strerror or error}")
                continue
            self.written[path] = content

    def remove(self) -> None:
        """Remove the files written, each only while it holds what was written: another job given the GPU since
        (a scheduler's prolog, the next launcher) keeps its own."""
        for path, content in self.written.items():
            try:
                with open(path, encoding="utf-8", errors="replace") as fh:
                    if fh.read(len(content) + 1) == content:
                        os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as error:
                self._warn(f"rankrun: DCGM job mapping: cannot remove {path}: {error.strerror or error}")
            self.off_file(path)
        self.written.clear()

    def _warn(self, line: str) -> None:
        if not self._warned:
            self._warned = True
            self.warn(line)


def _write_atomically(directory: Path, name: str, content: str) -> None:
    """``directory/name`` holds ``content`` all at once: the exporter reads it at any moment. The temp file's name
    starts with a dot, which the exporter's name pattern never matches."""
    fd, temp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            os.fchmod(fh.fileno(), _MODE)
            fh.write(content)
        os.replace(temp, directory / name)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
