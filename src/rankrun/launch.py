"""``python -m rankrun.launch``: the contract of ``python -m torch.distributed.launch`` (torch 2.13), for old scripts.

torchrun's options plus ``--use-env``/``--use_env``. Without it each worker gets ``--local-rank=N`` between the script
(or module) and its arguments, as torch's legacy launcher passes it, and ``LOCAL_RANK`` in its environment as
always; with it nothing is inserted. Where torch is hostile, this is not: ``--use-env=1|true|True`` is accepted
(torch's docs show ``--use-env=True``, which its parser refuses), ``--no-python`` without ``--use-env`` is one
line and exit 2 (torch: a traceback), the deprecation is one line said when the first worker starts (so that bad
input, or a launch that fails before, is its one error line), and a worker whose parser refuses ``--local-rank=N``
gets a failure report that says how to fix it.
"""

import sys
import types
from typing import Any

from rankrun.__main__ import main_exit


class _Callable(types.ModuleType):
    """Imported as ``rankrun.launch``, this module takes the package attribute of that name, the Python API's
    function: so the module forwards a call to it, and ``rankrun.launch(fn, ...)`` works either way."""

    def __call__(self, fn: Any, *args: Any, **options: Any) -> dict[int, Any]:
        from rankrun.api.launch import launch  # noqa: PLC0415 - only when called

        return launch(fn, *args, **options)


if __name__ == "__main__":
    main_exit(legacy=True)
else:
    sys.modules[__name__].__class__ = _Callable
