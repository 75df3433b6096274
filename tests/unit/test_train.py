"""Training is deterministic and good enough; the demo is packaged through the public API."""

import json

import pytest
import torch

from rtserve.model.data import make_dataset
from rtserve.model.train import accuracy, train
from tests.helpers import demo_eager

pytestmark = pytest.mark.unit

ACCURACY_FLOOR_V1 = 0.85


def test_two_runs_give_identical_weights():
    s1, s2 = train("1.0", epochs=1, hidden=64).state_dict(), demo_eager("1.0").state_dict()
    assert s1.keys() == s2.keys()
    assert all(torch.equal(s1[k], s2[k]) for k in s1)


def test_held_out_accuracy_above_floor(trained_dir):
    data = make_dataset()
    assert accuracy(demo_eager("1.0"), data.x_test, data.y_test) >= ACCURACY_FLOOR_V1
    meta = json.loads((trained_dir / "meta.json").read_text())
    assert meta["labels"] == ["low", "medium", "high"] and len(meta["feature_names"]) == 32
    assert meta["name"] == "realtime-classifier" and meta["version"] == "1.0"
    # the golden set is the first held-out rows, labelled; its accuracy is recorded
    assert meta["golden"]["labels"] == data.y_test[: len(meta["golden"]["labels"])].tolist()
    assert meta["accuracy"] >= ACCURACY_FLOOR_V1
    assert meta["provenance"]["torch"] == torch.__version__
