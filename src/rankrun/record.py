"""``@record``: a frozen dataclass without the code generation, for the value classes a launch defines at start-up.

``@dataclass(frozen=True)`` writes and compiles six functions for every class (``__init__``, ``__repr__``,
``__eq__``, ``__hash__``, ``__setattr__``, ``__delattr__``): 0.6-0.8 ms a class on these machines, which made
the launch spec's eleven classes alone cost 8-15 ms of every launch. ``@record`` gives those classes the same
behaviour from methods shared by all of them, which read the class's tuple of fields:

- construction by position or keyword, with defaults and ``field(default=..., default_factory=...)``, and
  ``TypeError`` for a missing, unknown or repeated argument;
- dataclass's ``repr`` (``Name(a=1, b='x')``, leaving out ``field(repr=False)``), equality between instances of
  the same class and a hash, both over the fields not marked ``field(compare=False)``;
- ``dataclasses.FrozenInstanceError`` on any assignment or deletion, and ``__match_args__`` for ``match``.

Type checkers see a frozen dataclass (``dataclass_transform``). What it leaves out: inheritance of fields,
``ClassVar`` fields, ``__post_init__``, and ``dataclasses.replace``/``fields``/``asdict`` (not a dataclass).
A construction costs a few microseconds more than a dataclass's: for values built once per launch, not per message.
"""

from __future__ import annotations

import inspect
from dataclasses import MISSING, Field, FrozenInstanceError, field
from typing import Any, NamedTuple, TypeVar, dataclass_transform

_T = TypeVar("_T", bound=type)


class _Field(NamedTuple):
    name: str
    default: Any
    factory: Any
    repr: bool
    compare: bool


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def record(cls: _T) -> _T:
    """Make ``cls`` a frozen value class over its annotated attributes (see the module docstring)."""
    if any(hasattr(base, "_record_fields") for base in cls.__mro__[1:]):
        raise TypeError(f"{cls.__name__}: a record does not inherit fields")
    fields: list[_Field] = []
    for name, annotation in inspect.get_annotations(cls).items():
        if str(annotation).startswith(("ClassVar", "typing.ClassVar")):
            raise TypeError(f"{cls.__name__}.{name}: a record has no ClassVar fields")
        value = cls.__dict__.get(name, MISSING)
        if isinstance(value, Field):
            spec = _Field(name, value.default, value.default_factory, value.repr, value.compare)
            if value.default is MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, value.default)
        else:
            spec = _Field(name, value, MISSING, True, True)
        if fields and _required(spec) and not _required(fields[-1]):
            raise TypeError(f"{cls.__name__}: non-default argument {name!r} follows default argument")
        fields.append(spec)
    cls._record_fields = tuple(fields)  # type: ignore[attr-defined]
    cls.__match_args__ = tuple(f.name for f in fields)  # type: ignore[attr-defined, misc]
    methods = {"__init__": _init, "__repr__": _repr, "__eq__": _eq, "__hash__": _hash, "__setattr__": _setattr,
               "__delattr__": _delattr}
    for attr, method in methods.items():
        setattr(cls, attr, method)
    return cls


def _required(spec: _Field) -> bool:
    return spec.default is MISSING and spec.factory is MISSING


def _fields(obj: object) -> tuple[_Field, ...]:
    return type(obj)._record_fields  # type: ignore[attr-defined, no-any-return]


def _init(self: object, *args: Any, **kwargs: Any) -> None:
    fields, name = _fields(self), type(self).__name__
    if len(args) > len(fields):
        raise TypeError(f"{name}() takes {len(fields)} positional arguments but {len(args)} were given")
    for spec, value in zip(fields, args, strict=False):
        if spec.name in kwargs:
            raise TypeError(f"{name}() got multiple values for argument {spec.name!r}")
        object.__setattr__(self, spec.name, value)
    for spec in fields[len(args):]:
        if spec.name in kwargs:
            value = kwargs.pop(spec.name)
        elif spec.default is not MISSING:
            value = spec.default
        elif spec.factory is not MISSING:
            value = spec.factory()
        else:
            raise TypeError(f"{name}() missing required argument: {spec.name!r}")
        object.__setattr__(self, spec.name, value)
    if kwargs:
        raise TypeError(f"{name}() got an unexpected keyword argument {next(iter(kwargs))!r}")


def _repr(self: object) -> str:
    shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in _fields(self) if f.repr)
    return f"{type(self).__qualname__}({shown})"


def _compared(obj: object) -> tuple[Any, ...]:
    return tuple(getattr(obj, f.name) for f in _fields(obj) if f.compare)


def _eq(self: object, other: object) -> object:  # a bool, or NotImplemented
    if other.__class__ is not self.__class__:
        return NotImplemented
    return _compared(self) == _compared(other)


def _hash(self: object) -> int:
    return hash(_compared(self))


def _setattr(_self: object, name: str, _value: object) -> None:
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _delattr(_self: object, name: str) -> None:
    raise FrozenInstanceError(f"cannot delete field {name!r}")
