"""bench.pod_rollout's phase ends: a phase whose old pods do not go fails, and the callers'
answers after it must exist and all come from the version it rolled to (the cluster tier's
rollouts, undos and rollbacks assert this; here each fault is shown to fail it)."""

from __future__ import annotations

import time

import pytest

from bench.loadgen import Record
from bench.pod_rollout import SETTLED, settle_after, settled

pytestmark = pytest.mark.unit


class Pods:
    """A Deployment whose terminating pods are gone after ``gone_after`` looks (None: never)."""

    def __init__(self, gone_after: int | None) -> None:
        self.gone_after, self.looks = gone_after, 0

    def terminating(self) -> list[str]:
        self.looks += 1
        return [] if self.gone_after is not None and self.looks > self.gone_after else ["rtserve-old-1"]

    def grace_seconds(self) -> float:
        return 0.5


class Load:
    def __init__(self) -> None:
        self.marks: list[str] = []

    def mark(self, phase: str) -> None:
        self.marks.append(phase)


def answers(phase: str, *versions: str | None, status: int = 200) -> list[Record]:
    return [Record(float(i), 0.01, status, v, phase) for i, v in enumerate(versions)]


def test_the_phase_ends_once_the_old_pods_are_gone():
    pods, load = Pods(gone_after=2), Load()
    settle_after(pods, load, "k8s-rollback", settle=0.0, drain_wait=5.0)
    assert load.marks == [f"k8s-rollback {SETTLED}"] and pods.looks == 3


def test_a_pod_still_terminating_fails_the_phase_instead_of_moving_on():
    load = Load()
    with pytest.raises(RuntimeError, match="k8s-rollback: rtserve-old-1 still terminating 1 s after it ended"):
        settle_after(Pods(gone_after=None), load, "k8s-rollback", settle=0.0, drain_wait=1.0)
    assert load.marks == []  # nothing counted as settled


def test_answers_after_the_phase_all_from_its_version_pass():
    records = answers("k8s-rollback", "2.0", "1.0") + answers(f"k8s-rollback {SETTLED}", "1.0", "1.0")
    assert settled(records, "k8s-rollback", "1.0") == []


def test_a_rollback_that_did_not_arrive_fails():
    records = answers(f"k8s-rollback {SETTLED}", "1.0", "2.0", "2.0")
    assert settled(records, "k8s-rollback", "1.0") == [
        "k8s-rollback: 2 of the 3 requests after it ended answered 200 by 2.0, not 200 by 1.0"
    ]


def test_a_failed_answer_after_the_phase_fails():
    records = answers(f"undo {SETTLED}", "1.0") + answers(f"undo {SETTLED}", None, status=503)
    assert settled(records, "undo", "1.0") == [
        "undo: 1 of the 2 requests after it ended answered 503 by None, not 200 by 1.0"
    ]


def test_traffic_that_stopped_before_the_phase_ended_fails():
    """The load ran out (its max_seconds) during a long deploy: no answer after the phase."""
    records = answers("undo", "1.0", "2.0")
    assert settled(records, "undo", "1.0") == ["undo: no request was sent after it ended (the load stopped before it)"]


def test_the_wait_defaults_to_the_pods_own_grace_period_plus_slack(monkeypatch):
    monkeypatch.setattr("bench.pod_rollout.DRAIN_SLACK_S", 0.5)
    began = time.monotonic()
    with pytest.raises(RuntimeError, match="undo: rtserve-old-1 still terminating 1 s after it ended"):
        settle_after(Pods(gone_after=None), Load(), "undo", settle=0.0)
    assert 0.9 < time.monotonic() - began < 5  # grace 0.5 s + slack 0.5 s
