"""The launcher's exit code: a handled signal, once received, wins over every outcome (issue #11 6b)."""

from __future__ import annotations

import signal

import pytest

from rankrun.errors import exit_code
from rankrun.proc.early import EarlyCatcher


@pytest.mark.parametrize(
    ("outcome", "first_signal", "expected"),
    [
        (0, None, 0),
        (1, None, 1),
        (3, None, 3),
        (130, None, 130),
        (0, signal.SIGINT, 130),  # the workers had all exited 0 as the signal came: still interrupted
        (1, signal.SIGTERM, 143),  # a failure being reported when the user gave up
        (3, signal.SIGHUP, 129),  # a launcher error after a signal
        (143, signal.SIGTERM, 143),  # the signal that stopped the group
        (143, signal.SIGINT, 130),  # the first one received decides, not a later one
    ],
)
def test_exit_code(outcome, first_signal, expected):
    assert exit_code(outcome, first_signal) == expected


def test_received_keeps_every_arrival_in_order_whoever_consumed_it():
    catcher = EarlyCatcher(())
    assert catcher.first is None
    catcher.note(signal.SIGTERM)
    catcher.note(signal.SIGINT)
    catcher.pending.clear()  # consumed (replayed to a stream): the record stays
    assert catcher.received == [signal.SIGTERM, signal.SIGINT]
    assert catcher.first == signal.SIGTERM


def test_a_signal_dropped_from_the_set_no_longer_counts():
    previous = signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    try:
        catcher = EarlyCatcher.install([signal.SIGUSR2])
        signal.raise_signal(signal.SIGUSR2)
        assert catcher.first == signal.SIGUSR2
        catcher.adopt([])  # the parsed --signals-to-handle does not have it: ignored, as inherited
        assert catcher.first is None
    finally:
        signal.signal(signal.SIGUSR2, previous)
