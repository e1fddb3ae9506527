"""The goodput account every job keeps (``events.goodput``), and its line at the job's end, on every node.

``JobGoodput`` is a consumer of the job's event stream, always there (``agent.observers`` adds it), folding each
event into this node's ``Ledger``; at the end it gives the account for ``job.end`` and the line (for a job that showed
a sign of training: ``JobGoodput.line``). Several nodes
(``GoodputShare``, a round-level feature): each node writes its account under the round's ``goodput/`` keys once its
workers of a round end, before it reports to the coordinator; at the job's end the node that hosts the job reads the
last round's, so its line is the job's account (the longest wall time, the worst node's parts) naming the worst node.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from rankrun.agent.round import Feature, Round
from rankrun.events.goodput import Ledger, as_value, from_value, job, line, worst_of
from rankrun.events.records import Goodput, Record

if TYPE_CHECKING:
    from rankrun.agent.attempt import AttemptResult
    from rankrun.rendezvous.keys import RoundWord
    from rankrun.rendezvous.member import Member


class JobGoodput:
    """This node's account, event by event, and (on the host of several nodes) the other nodes' at the job's end."""

    def __init__(self) -> None:
        self.ledger = Ledger()
        self.others: list[tuple[str, Goodput, bool]] = []  # (node, account, whether it kept a step), the host's only

    def on_event(self, event: Record) -> None:
        self.ledger.add(event)

    def line(self, own: Goodput) -> str | None:
        """The job's end line (without ``rankrun: ``): this node's account, or the job's where the others' are known.
        None when no attempt of this node showed a sign of training (a collective, a kept step, torch's store): a plain
        script or program, or a launch that never started workers; its start-up and its work cannot be told apart, and
        ``job.end`` has the account all the same."""
        ledger = self.ledger
        if not ledger.trained:
            return None
        if not self.others:
            return line(own, ledger.restarts, kept=ledger.kept_any)
        nodes = [(ledger.node, own, ledger.kept_any), *self.others]
        accounts = [n[1] for n in nodes]
        return line(job(accounts), ledger.restarts, kept=any(n[2] for n in nodes), nodes=len(nodes),
                    worst=nodes[worst_of(accounts)][0])


class GoodputShare(Feature):
    """Several nodes: this node's account for the host (see the module docstring). ``host``: whether this node hosts
    the job (it reads the others' at the end); ``bound``: seconds the host waits for the store at the end."""

    def __init__(self, goodput: JobGoodput, member: Member, now: Callable[[], float], *, host: bool,
                 bound: float) -> None:
        self._goodput, self._member, self._now, self._host, self._bound = goodput, member, now, host, bound
        self._written: str | None = None  # this node's key of the round before: one account a node in the store

    async def after(self, round_: Round, result: AttemptResult) -> None:  # noqa: ARG002 - the account says it
        word = round_.word
        if word is None or self._host:
            return
        import json  # noqa: PLC0415 - several nodes only (test_startup: one node imports no json)

        from rankrun.store.api import StoreUnavailable  # noqa: PLC0415 - several nodes only

        member, ledger = self._member, self._goodput.ledger
        value = json.dumps({"node": ledger.node, "kept": ledger.kept_any, **as_value(ledger.at(self._now()))})
        lease = member.job.id if member.job is not None else 0
        key = member.keys.goodput_of(word.round, word.group_rank)
        try:
            if self._written is not None:
                await member.store.delete(self._written)
            await member.store.put(key, value.encode(), lease=lease)
        except StoreUnavailable:
            return  # the host's line is then without this node's account
        self._written = key

    async def ended(self, end: RoundWord) -> None:
        if not self._host or end.stranded:
            return
        import json  # noqa: PLC0415 - several nodes only

        from rankrun.store.api import StoreUnavailable  # noqa: PLC0415 - several nodes only

        member = self._member
        try:
            async with asyncio.timeout(self._bound):
                entries, _ = await member.store.range(member.keys.goodput(end.round))
        except (TimeoutError, StoreUnavailable, OSError):
            return  # the line is then this node's own account: the job's end is not held up for it
        for entry in entries:
            try:
                obj = json.loads(entry.value)
            except ValueError:
                continue
            account = from_value(obj)
            if account is not None:
                self._goodput.others.append((str(obj.get("node", "?")), account, bool(obj.get("kept"))))
