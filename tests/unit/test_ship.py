"""Functions a worker cannot import (``__main__``, a notebook cell, lambdas, closures) shipped by value, and loaded in
a fresh interpreter, as a worker is; everything importable by reference."""

from __future__ import annotations

import os.path
import pickle
import subprocess
import sys

import pytest

from rankrun.api.ship import dumps, loads

CELL = '''
import math
SCALE = 10

def helper(x):
    return math.sqrt(x) * SCALE

def fact(n):
    return 1 if n <= 1 else n * fact(n - 1)

def make_adder(n):
    return lambda x, y=1: x + y + n

def uses_a_nested_function(values):
    def square(v):
        return helper(v) ** 2
    return [round(square(v)) for v in values]

counter = 0

def bump():
    global counter
    counter += 1
    return counter

def read():
    return counter
'''


def _cell() -> dict[str, object]:
    """What a notebook kernel or ``python script.py`` does: code run as ``__main__``, which a worker cannot import."""
    namespace: dict[str, object] = {"__name__": "__main__"}
    exec(compile(CELL, "<notebook cell>", "exec"), namespace)
    return namespace


def _in_a_fresh_interpreter(payload: bytes) -> object:
    """Load ``(fn, args)`` in a new interpreter, call it, and bring back the value (pickled plainly)."""
    program = ("import pickle, sys\nfrom rankrun.api.ship import loads\nfn, args = loads(sys.stdin.buffer.read())\n"
               "sys.stdout.buffer.write(pickle.dumps(fn(*args)))")
    done = subprocess.run([sys.executable, "-c", program], input=payload, capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr.decode()
    return pickle.loads(done.stdout)


@pytest.mark.parametrize(("name", "args", "value"), [
    ("helper", (16,), 40.0),  # a global constant and an imported module travel with it
    ("fact", (5,), 120),  # it refers to itself
    ("uses_a_nested_function", ([1, 4],), [100, 400]),  # a function defined inside it, calling a global one
])
def test_functions_of_main_run_in_a_fresh_interpreter(name: str, args: tuple[object, ...], value: object) -> None:
    fn = _cell()[name]
    with pytest.raises(pickle.PicklingError):
        pickle.dumps(fn)  # what plain pickle does with them
    assert _in_a_fresh_interpreter(dumps((fn, args))) == value


def test_lambdas_and_closures_travel_with_their_cells_and_defaults() -> None:
    add = _cell()["make_adder"](100)  # type: ignore[operator]
    assert _in_a_fresh_interpreter(dumps((add, (1,)))) == 102
    assert _in_a_fresh_interpreter(dumps((lambda x, *, k=3: x * k, (5,)))) == 15


def test_functions_sharing_globals_in_the_caller_share_them_in_the_worker() -> None:
    cell = _cell()
    bump, read = loads(dumps((cell["bump"], cell["read"])))
    assert (bump(), bump(), read()) == (1, 2, 2)  # two functions, one module's globals
    assert cell["counter"] == 0  # the caller's own globals untouched


def test_what_a_worker_can_import_goes_by_reference() -> None:
    data = dumps((os.path.join, pytest))
    assert b"posixpath" in data and b"join" in data and len(data) < 200  # names, not code
    assert loads(data) == (os.path.join, pytest)


def test_a_submodule_the_caller_imported_is_imported_in_the_worker_too() -> None:
    """``import xml.dom.minidom`` then ``xml.dom.minidom.parseString``: the function names only ``xml``, which a fresh
    interpreter imports without its submodules."""
    cell: dict[str, object] = {"__name__": "__main__"}
    exec(compile("import xml.dom.minidom\ndef tag(text):\n    return xml.dom.minidom.parseString(text).documentElement.tagName",
                 "<notebook cell>", "exec"), cell)
    assert _in_a_fresh_interpreter(dumps((cell["tag"], ("<job/>",)))) == "job"


def test_a_function_from_another_interpreter_is_refused_with_a_clear_error() -> None:
    tag = sys.implementation.cache_tag
    data = dumps(_cell()["fact"]).replace(tag.encode(), (tag[:-2] + "xx").encode())  # same length: pickle frames stay
    with pytest.raises(pickle.UnpicklingError, match="the workers must run the caller's interpreter"):
        loads(data)
