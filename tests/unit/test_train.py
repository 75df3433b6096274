"""Training is deterministic and good enough."""

import pytest
import torch

from rtserve.train import train

pytestmark = pytest.mark.unit

ACCURACY_FLOOR_V1 = 0.85


def test_two_runs_give_identical_weights():
    (m1, meta1), (m2, meta2) = train("1.0", epochs=1, hidden=64), train("1.0", epochs=1, hidden=64)
    s1, s2 = m1.state_dict(), m2.state_dict()
    assert s1.keys() == s2.keys()
    assert all(torch.equal(s1[k], s2[k]) for k in s1)
    assert meta1 == meta2


def test_held_out_accuracy_above_floor():
    _, meta = train("1.0", epochs=1, hidden=64)
    assert meta.accuracy >= ACCURACY_FLOOR_V1
    assert meta.labels == ["low", "medium", "high"] and len(meta.feature_names) == 32
