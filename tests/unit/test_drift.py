"""Drift scoring: reference fitting, sliding window, PSI."""

import pytest
import torch

from handler.drift import DriftMonitor, fit_reference, psi

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def reference():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(20_000, 6, generator=g)
    classes = torch.randint(0, 3, (20_000,), generator=g)
    return fit_reference(x, classes, 3)


def test_reference_bins_hold_a_tenth_each(reference):
    expected = torch.tensor(reference["expected"])
    assert expected.shape == (6, 10)
    assert torch.allclose(expected, torch.full_like(expected, 0.1), atol=0.002)
    assert sum(reference["class_expected"]) == pytest.approx(1.0)


def test_window_counts_match_recomputation(reference):
    monitor = DriftMonitor(reference, window=500)
    g = torch.Generator().manual_seed(2)
    seen_x, seen_c = [], []
    for size in [1, 7, 32, 200, 333, 499, 500, 501, 3, 64]:
        x = torch.randn(size, 6, generator=g) * 1.5
        c = torch.randint(0, 3, (size,), generator=g)
        monitor.update(x, c)
        seen_x.append(x)
        seen_c.append(c)
        fresh = DriftMonitor(reference, window=500)
        fresh.update(torch.cat(seen_x)[-500:], torch.cat(seen_c)[-500:])
        assert monitor.rows == fresh.rows == min(500, sum(len(s) for s in seen_x))
        assert torch.equal(monitor.counts, fresh.counts)
        assert torch.equal(monitor.class_counts, fresh.class_counts)


def test_in_distribution_is_stable_and_shift_is_flagged(reference):
    g = torch.Generator().manual_seed(3)
    monitor = DriftMonitor(reference, window=2000)
    monitor.update(torch.randn(2000, 6, generator=g), torch.randint(0, 3, (2000,), generator=g))
    calm = monitor.scores()
    assert max(calm.features) < 0.05 and calm.prediction < 0.05
    shifted = torch.randn(2000, 6, generator=g)
    shifted[:, 2] += 1.5
    monitor.update(shifted, torch.zeros(2000, dtype=torch.long))
    drift = monitor.scores()
    assert drift.features[2] > 0.2 and drift.prediction > 0.2
    assert max(drift.features[:2] + drift.features[3:]) < 0.05


def test_psi_definition():
    a = torch.tensor([0.5, 0.5])
    e = torch.tensor([0.25, 0.75])
    expected = 0.25 * torch.log(torch.tensor(2.0)) + (-0.25) * torch.log(torch.tensor(0.5 / 0.75))
    assert float(psi(a, e)) == pytest.approx(float(expected))
    assert float(psi(e, e)) == 0.0
