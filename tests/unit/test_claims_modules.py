"""Each package's docstring names every module of its folder: the module map a newcomer reads first is the folder's.

The rule, for every package below ``rankrun`` (``src/rankrun/*/__init__.py``, and nested ones such as
``store/embedded/``): each ``NAME.py`` of the folder but ``__init__`` and ``__main__`` is named in the package's
docstring in backquotes, as ``NAME``, ``NAME.py`` or dotted from the package itself (``store.embedded.NAME``,
``rankrun.store.embedded.NAME``); each sub-package as ``NAME`` or ``NAME/``. A name qualified by another package
(``rendezvous.round`` in ``agent/``'s docstring) does not count for this one. The top-level modules are drawn in
docs/design.md's module map instead. A module that is not named is a module the docstring forgot (issue 35, item 9).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "rankrun"

PACKAGES = sorted(p.parent for p in SRC.rglob("__init__.py") if p.parent != SRC)


def unnamed(package: Path, root: Path = SRC) -> list[str]:
    """The modules (``NAME.py``) and sub-packages (``NAME/``) of ``package`` that its docstring does not name."""
    docstring = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    named = _named(docstring, ".".join(package.relative_to(root.parent).parts))
    modules = [f"{p.stem}.py" for p in sorted(package.glob("*.py")) if p.stem not in ("__init__", "__main__")]
    subpackages = [f"{p.parent.name}/" for p in sorted(package.glob("*/__init__.py"))]
    return [m for m in modules + subpackages if m.removesuffix(".py").removesuffix("/") not in named]


def _named(docstring: str, dotted: str) -> set[str]:
    """The names a docstring gives in backquotes, relative to the package ``dotted`` (``rankrun.store.embedded``):
    ``NAME``, ``NAME.py``, ``NAME/``, or the package's own dotted path (whole or from any of its parts) then ``NAME``."""
    prefixes = [".".join(dotted.split(".")[i:]) + "." for i in range(dotted.count(".") + 1)]
    names = set()
    for quoted in re.findall(r"`+([^`]+)`+", docstring):
        name = quoted.removesuffix(".py").removesuffix("/")
        for prefix in prefixes:
            if name.startswith(prefix):
                name = name.removeprefix(prefix)
                break
        if name.isidentifier():
            names.add(name)
    return names


@pytest.mark.parametrize("package", PACKAGES, ids=[p.relative_to(SRC).as_posix() for p in PACKAGES])
def test_the_package_docstring_names_every_module(package):
    assert unnamed(package) == [], f"{package.relative_to(SRC)}/__init__.py's docstring does not name them"


def test_every_package_is_checked():
    assert {p.relative_to(SRC).as_posix() for p in PACKAGES} >= {"agent", "store", "store/embedded", "store/etcd",
                                                                 "stacks/shim", "workerstore", "events"}


def _package(tmp_path: Path, docstring: str, modules: tuple[str, ...] = ("wire", "relay")) -> Path:
    package = tmp_path / "rankrun" / "store" / "embedded"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f'"""{docstring}"""\n')
    (package / "__main__.py").write_text("")
    for module in modules:
        (package / f"{module}.py").write_text("")
    (package / "deep").mkdir()
    (package / "deep" / "__init__.py").write_text("")
    return package


def test_the_check_sees_a_forgotten_module(tmp_path):
    package = _package(tmp_path, "The embedded store: ``wire`` (frames) and ``deep/``.")
    assert unnamed(package, tmp_path / "rankrun") == ["relay.py"]


def test_the_check_sees_a_forgotten_subpackage(tmp_path):
    package = _package(tmp_path, "``wire``, ``relay``.")
    assert unnamed(package, tmp_path / "rankrun") == ["deep/"]


@pytest.mark.parametrize("docstring", [
    "``wire``, ``relay.py`` and ``deep/``.",
    "``store.embedded.wire``, ``rankrun.store.embedded.relay`` and ``embedded.deep``.",
    "`wire`, `relay`, `deep`",
])
def test_the_check_takes_each_spelling(tmp_path, docstring):
    assert unnamed(_package(tmp_path, docstring), tmp_path / "rankrun") == []


@pytest.mark.parametrize("docstring", [
    "``rendezvous.relay``, ``wire``, ``deep``",  # another package's relay, not this one's
    "``wire``, relay, ``deep``",  # a word in the prose is not a name given
    "``wire``, ``relay()``, ``deep``",
    "``wire``, ``relays``, ``deep``",
])
def test_the_check_does_not_take_another_name(tmp_path, docstring):
    assert unnamed(_package(tmp_path, docstring), tmp_path / "rankrun") == ["relay.py"]
