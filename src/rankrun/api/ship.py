"""Functions for fresh interpreters: by reference when a worker can import them, by value when it cannot.

pickle sends a function as its module and qualified name, which a worker (a fresh interpreter) looks up again. That
fails for what a script's ``__main__`` or a notebook cell defines, for lambdas and for closures. ``dumps`` sends those
by value instead:

- the code object through ``marshal``: safe here, because the workers run the same interpreter, and checked (the
  bytecode tag, ``sys.implementation.cache_tag``, must match, or ``loads`` says so);
- its name, qualified name, defaults, keyword defaults, ``__dict__`` and closure cells;
- the globals its code names (``LOAD_GLOBAL``/``LOAD_NAME`` in it and in the code nested in it), pickled the same way,
  so a helper function or a constant of ``__main__`` travels with it. Functions that shared one globals dict in the
  caller share one in the worker;
- the submodules it reaches through a module's attributes (``os.path`` through ``os``, ``rankrun.api.values``
  through ``rankrun``) that the caller had imported: the worker imports them before the function runs, as the
  caller's ``import a.b`` had done.

Everything importable (a library's functions and classes, a module) travels by reference. What is not shipped by
value: classes defined in ``__main__`` (an instance of one pickles by reference and fails to load in the worker).
A function's state is set after it is created, so a function that refers to itself (recursion) travels too.
"""

from __future__ import annotations

import builtins
import contextlib
import dis
import importlib
import io
import marshal
import pickle
import sys
import types
from typing import Any

_EMPTY = "<rankrun: empty cell>"  # a closure cell not yet filled when the function was shipped
_SHARED: dict[int, dict[str, Any]] = {}  # the caller's globals dict id → its stand-in in this process


def _findable(fn: types.FunctionType) -> bool:
    """Whether a fresh interpreter finds ``fn`` again by its module and qualified name."""
    module, qualname = fn.__module__, fn.__qualname__
    if not module or module == "__main__" or "<" in qualname:  # <lambda>, <locals>
        return False
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return False
    return found is fn


def _global_names(code: types.CodeType) -> set[str]:
    names = {ins.argval for ins in dis.get_instructions(code)
             if ins.opname in ("LOAD_GLOBAL", "STORE_GLOBAL", "DELETE_GLOBAL", "LOAD_NAME")}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _attribute_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _attribute_names(const)
    return names


def _submodules(used: list[Any], names: set[str]) -> list[str]:
    """The imported submodules of the modules in ``used`` that ``names`` can reach (every part of their name in it)."""
    found = set()
    for value in used:
        if isinstance(value, types.ModuleType):
            prefix = value.__name__ + "."
            found |= {name for name in list(sys.modules)
                      if name.startswith(prefix) and set(name[len(prefix):].split(".")) <= names}
    return sorted(found)


def _skeleton(code: bytes, name: str, cells: int, tag: str, space: int) -> types.FunctionType:
    """The function without its state (``_fill`` sets it): what ``pickle`` memoises before the state, for cycles."""
    if tag != sys.implementation.cache_tag:
        raise pickle.UnpicklingError(f"function {name!r} was shipped by value from {tag}, this worker runs "
                                     f"{sys.implementation.cache_tag}: the workers must run the caller's interpreter")
    namespace = _SHARED.setdefault(space, {"__builtins__": builtins})
    closure = tuple(types.CellType() for _ in range(cells)) or None
    return types.FunctionType(marshal.loads(code), namespace, name, None, closure)  # noqa: S302 - our own caller's code


def _fill(fn: types.FunctionType, state: tuple[Any, ...]) -> None:
    namespace, defaults, kwdefaults, cells, qualname, module, attributes, doc, submodules = state
    for name in submodules:
        with contextlib.suppress(ImportError):  # one the caller made up (a lazy or virtual module) fails when used
            importlib.import_module(name)
    fn.__globals__.update(namespace)
    fn.__defaults__, fn.__kwdefaults__, fn.__qualname__, fn.__module__, fn.__doc__ = defaults, kwdefaults, qualname, module, doc
    fn.__dict__.update(attributes)
    for cell, value in zip(fn.__closure__ or (), cells, strict=True):
        if value != _EMPTY:
            cell.cell_contents = value


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, types.FunctionType) and not _findable(obj):
            return _by_value(obj)
        if isinstance(obj, types.ModuleType):
            return importlib.import_module, (obj.__name__,)
        return NotImplemented


def _by_value(fn: types.FunctionType) -> tuple[Any, ...]:
    code = fn.__code__
    namespace = {n: fn.__globals__[n] for n in sorted(_global_names(code)) if n in fn.__globals__}
    cells = []
    for cell in fn.__closure__ or ():
        try:
            cells.append(cell.cell_contents)
        except ValueError:  # empty
            cells.append(_EMPTY)
    submodules = _submodules([*namespace.values(), *cells], _attribute_names(code))
    state = (namespace, fn.__defaults__, fn.__kwdefaults__, cells, fn.__qualname__, fn.__module__, dict(fn.__dict__),
             fn.__doc__, submodules)
    args = (marshal.dumps(code), fn.__name__, len(cells), sys.implementation.cache_tag, id(fn.__globals__))
    return _skeleton, args, state, None, None, _fill


def dumps(obj: Any) -> bytes:
    """``obj`` pickled, with the functions a fresh interpreter could not import shipped by value."""
    out = io.BytesIO()
    _Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return out.getvalue()


def loads(data: bytes) -> Any:
    return pickle.loads(data)  # noqa: S301 - from the launcher of this very job, never from the network
