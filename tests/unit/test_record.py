"""``@record`` behaves as ``@dataclass(frozen=True)`` does for the classes that use it: checked against a twin."""

from __future__ import annotations

import dataclasses
from dataclasses import FrozenInstanceError, dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rankrun.record import record


@record
class Rec:
    """A record with every kind of field the launcher's classes use."""

    name: str
    count: int = 0
    tags: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict, repr=False, compare=False)
    secret: bytes | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Rec_:  # the dataclass twin; its repr is compared under Rec's name
    """The same fields as a frozen dataclass."""

    name: str
    count: int = 0
    tags: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict, repr=False, compare=False)
    secret: bytes | None = field(default=None, repr=False)


values = st.fixed_dictionaries({
    "name": st.text(max_size=5),
    "count": st.integers(),
    "tags": st.tuples(st.text(max_size=3)),
    "env": st.dictionaries(st.text(max_size=2), st.text(max_size=2), max_size=2),
    "secret": st.none() | st.binary(max_size=4),
})


@given(values, values)
def test_repr_equality_and_hash_are_the_dataclasses(a: dict[str, object], b: dict[str, object]) -> None:
    ra, rb, da, db = Rec(**a), Rec(**b), Rec_(**a), Rec_(**b)  # type: ignore[arg-type]
    assert repr(ra) == repr(da).replace("Rec_(", "Rec(")
    assert (ra == rb) == (da == db)
    if ra == rb:  # equal ones hash alike
        assert hash(ra) == hash(rb)
    assert ra != da  # never equal to another class's instance, even with the same values


def test_positional_keyword_defaults_and_factories() -> None:
    a = Rec("x", 2)
    assert (a.name, a.count, a.tags, a.env, a.secret) == ("x", 2, (), {}, None)
    assert Rec("x").env is not Rec("x").env  # a fresh dict each time, as default_factory promises
    assert Rec(name="y", tags=("t",)).tags == ("t",)
    assert Rec.__match_args__ == ("name", "count", "tags", "env", "secret")
    match Rec("z", 3):
        case Rec(name, count):
            assert (name, count) == ("z", 3)


@pytest.mark.parametrize(("args", "kwargs", "message"), [
    ((), {}, "missing required argument: 'name'"),
    (("a", 1, (), {}, None, "extra"), {}, "takes 5 positional arguments but 6 were given"),
    (("a",), {"name": "b"}, "multiple values for argument 'name'"),
    (("a",), {"colour": "red"}, "unexpected keyword argument 'colour'"),
])
def test_bad_arguments_are_type_errors_like_the_dataclasses(args: tuple[object, ...], kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(TypeError, match=message):
        Rec(*args, **kwargs)  # type: ignore[arg-type, misc]
    with pytest.raises(TypeError):
        Rec_(*args, **kwargs)  # type: ignore[arg-type, misc]


def test_frozen() -> None:
    a = Rec("x")
    with pytest.raises(FrozenInstanceError):
        a.count = 3  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        del a.name  # type: ignore[misc]
    assert a.count == 0


def test_what_it_refuses_to_define() -> None:
    with pytest.raises(TypeError, match="non-default argument 'b' follows default argument"):
        @record
        class Bad:
            a: int = 0
            b: int  # type: ignore[misc]

    with pytest.raises(TypeError, match="does not inherit fields"):
        @record
        class Child(Rec):
            extra: int = 0

    assert not dataclasses.is_dataclass(Rec)  # replace/asdict/fields do not apply: said in the docstring
