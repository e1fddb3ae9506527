"""What the keeper saw, as the job's events (``rankrun.agent.checkpoint.record``)."""

from __future__ import annotations

from rankrun.agent.checkpoint import record
from rankrun.events.records import CheckpointKept, CheckpointRestored


def test_a_kept_step_a_refusal_and_a_restore_are_their_events():
    assert record("kept", {"step": 12, "ranks": [0, 1, 2, 3], "bytes": 4000, "seconds": 0.25}) == \
        CheckpointKept(12, "0-3", 4000, 0.25, "kept", None)
    assert record("refused", {"rank": 3, "step": 12, "bytes": 9000, "why": "no room"}) == \
        CheckpointKept(12, "3", 9000, 0.0, "refused", "no room")
    assert record("refused", {"rank": 3, "step": -1, "bytes": 9000, "why": "no room"}).step == 0  # a reservation ahead
    assert record("restored", {"attempt": 2, "step": 6, "source": "disk", "ranks": [4, 5], "bytes": 10,
                               "seconds": 0.5}) == CheckpointRestored(2, 6, "disk", "4-5", 10, 0.5)
