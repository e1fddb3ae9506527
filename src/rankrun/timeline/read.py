"""Reading event files (schema version 1, JSON lines): each line checked, every problem one message naming the file and line.

Only the keys the schema lists are checked (present, of their type or null): the table of keys and kinds is read from
the events' JSON Schema (``rankrun.events.schema_path``). An event name the schema does not list is kept as it is (a
newer producer may add events within version 1) and drawn as a plain mark.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any

from rankrun.events import schema_path
from rankrun.events.fields import float_of, int_of, str_of
from rankrun.events.records import EVENTS, Record, from_json, keys

# the schema's types as this reader names them; an enum (an outcome, a verdict) is one of strings
_TYPES = {"integer": "int", "number": "num", "string": "str", "object": "obj"}
# the keys lanes are built on (the attempt and round numbers): required; any other of an event's keys may be null, so a
# file whose producer did not know a value is still drawn
REQUIRED = ("attempt", "round")


def _kind(prop: dict[str, Any], defs: dict[str, Any]) -> str:
    """One property of the schema as a key of _CHECKS: "int", "num", "str", "ints" or "strs"."""
    if "$ref" in prop:
        prop = defs[prop["$ref"].rsplit("/", 1)[1]]
    if "enum" in prop:
        return "str"
    kinds = prop["type"] if isinstance(prop["type"], list) else [prop["type"]]
    [kind] = [k for k in kinds if k != "null"]
    return _TYPES[prop["items"]["type"]] + "s" if kind == "array" else _TYPES[kind]


def key_table(schema: dict[str, Any]) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """The keys every event has and each event's own, with their kinds, from the events' JSON Schema (pure): "?" where
    this reader takes a null too (all of an event's keys but ``REQUIRED``)."""
    defs = schema["$defs"]
    common = {"v": "int", **{k: _kind(p, defs) for k, p in defs["common"]["properties"].items() if k != "v"}, "event": "str"}
    keys: dict[str, dict[str, str]] = {}
    for branch in schema["oneOf"]:
        props = defs[branch["$ref"].rsplit("/", 1)[1]]["properties"]
        own = {k: p for k, p in props.items() if k not in common}
        keys[props["event"]["const"]] = {k: _kind(p, defs) + ("" if k in REQUIRED else "?") for k, p in own.items()}
    return common, keys


COMMON, KEYS = key_table(json.loads(schema_path().read_text()))
# each event's keys that came later within version 1 (a stall's ``silent``, job.end's ``goodput``): their records give
# them a default, which a file written before them reads as
LATER = {name: {f.name for f in getattr(kind, "_record_fields") if f.name in keys(kind) and f.default is not MISSING}  # noqa: B009 - set by @record
         for kind, name in EVENTS.items()}


class BadInput(Exception):
    """One line for the user: where (file, and line when there is one) and what is wrong."""


@dataclass(frozen=True)
class Event:
    """One line of one file: the object as written (shown whole on the page), where it came from (for messages and
    lanes), and the record the events' own decoder (``records.from_json``) reads from it; ``None`` for an event this
    schema does not list. Its stamp (``ts``, ``mono``, ``run``, ``node``) is the record's; its own keys are read with
    the defensive getters (``rankrun.events.fields``), as a file may hold a null where the record's type has none."""

    source: str
    line: int
    data: dict[str, object] = field(hash=False)
    record: Record | None = field(default=None, hash=False, compare=False)

    @property
    def name(self) -> str:
        return str(self.data["event"])

    @property
    def node(self) -> str:
        return self.record.node if self.record is not None else str(self.data["node"])

    @property
    def run(self) -> str:
        return self.record.run if self.record is not None else str(self.data["run"])

    @property
    def ts(self) -> float:
        return float(self.record.ts if self.record is not None else self.data["ts"])  # type: ignore[arg-type]  # checked

    @property
    def mono(self) -> float:
        return float(self.record.mono if self.record is not None else self.data["mono"])  # type: ignore[arg-type]

    def integer(self, key: str) -> int | None:
        return int_of(self.data, key)

    def number(self, key: str) -> float | None:
        return float_of(self.data, key)

    def text(self, key: str) -> str | None:
        return str_of(self.data, key)


def decode(obj: dict[str, object]) -> Record | None:
    """The record a checked object stands for, read by the records' own decoder (its keys only: a newer producer may add
    others within version 1); ``None`` for an event name the schema does not list."""
    name = str(obj["event"])
    if name not in KEYS:
        return None
    return from_json({key: obj[key] for key in (*COMMON, *KEYS[name]) if key in obj})


def _number(value: object) -> bool:
    # JSON true/false are no numbers, though Python's bool is an int
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


_CHECKS: dict[str, Callable[[object], bool]] = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "num": _number,
    "str": lambda v: isinstance(v, str),
    "ints": lambda v: isinstance(v, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in v),
    "strs": lambda v: isinstance(v, list) and all(isinstance(i, str) for i in v),
    "obj": lambda v: isinstance(v, dict),
}


def _fits(value: object, kind: str) -> bool:
    """``kind``: a key of _CHECKS, with "?" when null is allowed too."""
    if kind.endswith("?"):
        return value is None or _CHECKS[kind[:-1]](value)
    return _CHECKS[kind](value)


def check(obj: object) -> str | None:
    """What makes ``obj`` (one decoded line) no schema-1 event, or None when it is one."""
    if not isinstance(obj, dict):
        return "not a JSON object"
    if obj.get("v") != 1 or isinstance(obj.get("v"), bool):
        return f"not schema version 1 (v: {json.dumps(obj.get('v'))})"
    for key, kind in [*COMMON.items(), *KEYS.get(str(obj.get("event")), {}).items()]:
        if key not in obj:
            if key in LATER.get(str(obj.get("event")), ()):
                continue  # a key added to the event within version 1: a file written before it has none
            return f"no {key!r} key" + (f" in a {obj['event']} event" if key not in COMMON else "")
        if not _fits(obj[key], kind):
            return f"{key!r} is {json.dumps(obj[key])[:40]}, not {_KIND_WORDS[kind.rstrip('?')]}"
    return None


_KIND_WORDS = {"int": "an integer", "num": "a finite number", "str": "a string", "ints": "a list of integers",
               "strs": "a list of strings"}


def parse_lines(source: str, lines: Iterable[bytes]) -> list[Event]:
    """The events of one file's lines; blank lines are skipped (a writer's trailing newline)."""
    events = []
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise BadInput(f"{source}:{number}: not UTF-8 text") from None
        try:
            obj = json.loads(text)
        except ValueError as err:
            raise BadInput(f"{source}:{number}: not JSON ({err.args[0].split(':')[0]})") from None
        if (problem := check(obj)) is not None:
            raise BadInput(f"{source}:{number}: not a schema-1 event: {problem}")
        events.append(Event(source, number, obj, decode(obj)))
    return events


def read_file(path: str) -> list[Event]:
    """The events in the file at ``path``; a file with none is bad input (nothing to draw from it)."""
    try:
        with Path(path).open("rb") as fh:
            events = parse_lines(path, fh)
    except OSError as err:
        raise BadInput(f"{path}: cannot read: {err.strerror or err}") from None
    if not events:
        raise BadInput(f"{path}: no events in the file")
    return events


def one_run(events: list[Event], run: str | None) -> list[Event]:
    """The events of one run: ``run``, or the only one there is (files are appended to, so one may hold several)."""
    if run is not None:
        chosen = [e for e in events if e.run == run]
        if not chosen:
            raise BadInput(f"--run {run}: no events of that run (runs there: {', '.join(sorted({e.run for e in events}))})")
        return chosen
    first = events[0]
    for e in events:
        if e.run != first.run:
            raise BadInput(f"{e.source}:{e.line}: run {e.run!r}, but {first.source}:{first.line} is run {first.run!r};"
                           " choose one with --run")
    return events
