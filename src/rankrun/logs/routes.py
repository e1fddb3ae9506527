"""Where each worker stream goes, decided once per attempt (pure).

torchrun's table for ``-r``/``-t``/``--local-ranks-filter`` (console or not, a per-rank file
or not), the prefix rule (raw with one rank on the console, as torchrun's default output; the
``[role rank]:`` prefix with several), and how the worker's stdio is wired (``Stdio``):

- a terminal of its own when the launcher runs in the foreground of a terminal and this is
  the only rank on the console, with nothing of it going to files (torchrun's ``-t`` makes
  the worker's stdout a file, so there is no terminal to give there either);
- one merged pipe when both of its streams go only to the console and the console's stdout
  and stderr are one destination (the order between them is then visible and kept);
- separate pipes otherwise.
"""

from __future__ import annotations

from rankrun.proc.spawn import Stdio
from rankrun.ranges import range_string
from rankrun.record import record
from rankrun.spec import DEFAULT_PREFIX_TEMPLATE, LogSpec, Stream


@record
class RoutePlan:
    to_console: bool
    to_file: bool


@record
class ConsoleFacts:
    """What the launcher's own stdio is like (observed once, at start)."""

    merged: bool  # stdout and stderr are the same destination
    interactive: bool  # stdin and stdout are a terminal and we are its foreground job


def plan_route(spec: LogSpec, local_rank: int, stdout: bool) -> RoutePlan:
    """torchrun's console/file semantics for one stream of one local rank."""
    redirect, tee = spec.redirects[local_rank], spec.tee[local_rank]
    redirected = redirect.has_stdout() if stdout else redirect.has_stderr()
    teed = tee.has_stdout() if stdout else tee.has_stderr()
    to_file = (redirected or teed) and not spec.discard_files
    visible = spec.local_ranks_filter is None or local_rank in spec.local_ranks_filter
    to_console = visible and (teed or not redirected)
    return RoutePlan(to_console=to_console, to_file=to_file)


def filter_note(spec: LogSpec, nproc: int) -> str | None:
    """The warning for a ``--local-ranks-filter`` that names none of this node's ``nproc`` local ranks: no worker's
    output would reach its console, without a word (torchrun says nothing). Not an error: a job's nodes may run
    different ``--nproc-per-node`` from one command line, and a filter naming some local ranks this node lacks is
    just as fine (negative ranks, which no node has, are refused as bad input: ``spec.parse_ranks_filter``)."""
    chosen = spec.local_ranks_filter
    if chosen is None or any(rank < nproc for rank in chosen):
        return None
    return (f"warning: --local-ranks-filter {','.join(map(str, sorted(chosen)))} names no local rank of this node"
            f" (it runs local rank{'s' if nproc > 1 else ''} {range_string(range(nproc))}): no worker's output reaches"
            " its console")


def console_ranks(spec: LogSpec, nproc: int) -> list[int]:
    """Local ranks with at least one stream on the console."""
    return [lr for lr in range(nproc) if any(plan_route(spec, lr, stdout=out).to_console for out in (True, False))]


def prefix_template(spec: LogSpec, nproc: int) -> str:
    """The console prefix: the user's, else none for a single console rank (unless tee'd, as torchrun), else the default."""
    if spec.prefix_template is not None:
        return spec.prefix_template
    ranks = console_ranks(spec, nproc)
    teed = any(spec.tee[lr] is not Stream.NONE for lr in ranks)
    return DEFAULT_PREFIX_TEMPLATE if len(ranks) > 1 or teed else ""


def plan_stdio(spec: LogSpec, nproc: int, local_rank: int, facts: ConsoleFacts) -> tuple[Stdio, bool]:
    """(how the worker's output is wired, whether its stdin is /dev/null)."""
    out, err = plan_route(spec, local_rank, stdout=True), plan_route(spec, local_rank, stdout=False)
    console_only = out.to_console and err.to_console and not out.to_file and not err.to_file
    terminal_rank = _terminal_rank(spec, nproc, facts)
    if terminal_rank is not None:
        return (Stdio.TERMINAL, False) if local_rank == terminal_rank else (_pipes(console_only, facts), True)
    return _pipes(console_only, facts), False


def _pipes(console_only: bool, facts: ConsoleFacts) -> Stdio:
    return Stdio.MERGED if console_only and facts.merged else Stdio.PIPES


def _terminal_rank(spec: LogSpec, nproc: int, facts: ConsoleFacts) -> int | None:
    if not (facts.interactive and facts.merged):  # the worker's stderr would land on the terminal too
        return None
    ranks = console_ranks(spec, nproc)
    if len(ranks) != 1:
        return None
    out, err = plan_route(spec, ranks[0], stdout=True), plan_route(spec, ranks[0], stdout=False)
    return ranks[0] if out.to_console and err.to_console and not out.to_file and not err.to_file else None
