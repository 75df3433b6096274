"""The helpers the live-route tests (tests/integration/test_live*.py) judge the agent by."""

from __future__ import annotations

import math
import random

import pytest

from tests.helpers import WEYL_STEP, settled, shadow_cost, shadow_share_range

pytestmark = pytest.mark.unit


def copies(start: float, first: int, requests: int, percent: float) -> int:
    """How many of ``requests`` consecutive requests from the ``first``th the agent copies to a
    ``percent`` shadow: Routes.draw and Routes.inShadow (agent/src/rtserve/agent/Routes.java),
    line for line."""
    count = 0
    for n in range(first, first + requests):
        x = start + (n & 0xFFFFFFFF) * WEYL_STEP
        count += (x - math.floor(x)) * 100 < percent
    return count


@pytest.mark.parametrize("requests, percent", [(2000, 25.0), (300, 10.0), (50, 50.0)])
def test_the_share_range_holds_every_run_of_the_agents_draws(requests, percent):
    fewest, most = shadow_share_range(requests, percent)
    rng = random.Random(34)
    seen = {copies(rng.random(), rng.randrange(10**6), requests, percent) for _ in range(300)}
    assert fewest <= min(seen) and max(seen) <= most, (fewest, most, sorted(seen))
    assert most - fewest <= 6 and fewest <= requests * percent / 100 <= most


def test_the_share_range_fails_a_share_off_by_half_a_point():
    fewest, most = shadow_share_range(2000, 25.0)
    assert not fewest <= copies(0.3, 0, 2000, 25.5) <= most
    assert not fewest <= copies(0.3, 0, 2000, 24.5) <= most


def test_settled_waits_for_a_log_to_stop_growing():
    grown = iter([[1], [1, 2], [1, 2, 3]])
    last = []

    def read():
        nonlocal last
        last = next(grown, last)
        return last

    assert settled(read, at_least=1, quiet_s=0.3, timeout=5) == [1, 2, 3]


class NoisyLoad:
    """A stand-in for :class:`bench.loadgen.SteadyLoad` under :func:`tests.helpers.shadow_cost`:
    each window marked gets 100 answers of 10 ms; the second off window has 2 of 900 ms (a noisy
    machine), and each on window 5 of 510 ms (a candidate in the callers' path for 5% of them)."""

    def __init__(self) -> None:
        self.records: list = []

    def mark(self, phase: str) -> None:
        from bench.loadgen import Record

        condition, _, window = phase.partition(" ")
        slow = {"on": (5, 0.51), "off": (2, 0.9) if window.endswith(".1") else (0, 0)}.get(condition)
        if slow is None:
            return
        n, latency = slow
        self.records += [Record(len(self.records), latency if i < n else 0.01, 200, "1.0", phase) for i in range(100)]


def test_the_allowance_cap_keeps_noise_from_passing_a_candidate_in_the_path():
    def measure(cap):
        [(off, on, allowed)] = shadow_cost(NoisyLoad(), lambda on: None, 0.0, 2, 0.0, 1, "a fake", max_allowed_ms=cap)
        return on.p99_ms - off.p99_ms, allowed

    moved, allowed = measure(None)
    assert moved == 500 and allowed == 890  # the noise alone would let it pass
    moved, allowed = measure(100.0)
    assert moved > allowed == 100.0
