"""The job's lifecycle events (schema version 1): the records (``records``), the stream that stamps and fans them out
(``stream``), their consumers, which take the records themselves (the ``--events`` file ``log``, the ``metrics``
endpoint, ``torchelastic``'s lines, the ``dcgm`` job files), the account of where a node's time went (``goodput``),
the defensive getters of a reader of the files
(``fields``), and the JSON Schema shipped beside them (``schema_path``).

Below the agent: the agent imports this package, never the other way.
"""

from __future__ import annotations

from pathlib import Path


def schema_path() -> Path:
    """Where the installed JSON Schema of the events (draft 2020-12) is."""
    return Path(__file__).with_name("schema.json")
