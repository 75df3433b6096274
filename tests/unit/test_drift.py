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


# --------------------------------------------------------------------------- other output kinds

TEACHER = torch.nn.Linear(6, 4)
torch.nn.init.normal_(TEACHER.weight, generator=torch.Generator().manual_seed(5))
SIGNATURES = {
    "regression": {"name": "dose", "kind": "regression", "width": 2, "targets": ["low", "high"]},
    "multi_label": {"name": "tags", "kind": "multi_label", "width": 4, "labels": list("wxyz"), "threshold": 0.4},
    "embedding": {"name": "vector", "kind": "embedding", "width": 4},
}


def answers(kind: str, x: torch.Tensor) -> torch.Tensor:
    """What the answers of ``kind`` carry for rows ``x``: a fixed linear teacher, sigmoid for multi-label."""
    with torch.no_grad():
        raw = TEACHER(x)
    return torch.sigmoid(raw) if kind == "multi_label" else raw[:, :2] if kind == "regression" else raw


@pytest.fixture(scope="module")
def training():
    return torch.randn(20_000, 6, generator=torch.Generator().manual_seed(6))


@pytest.fixture(scope="module")
def references(training) -> dict:
    return {
        kind: fit_reference(training, None, 0, output=signature, values=answers(kind, training))
        for kind, signature in SIGNATURES.items()
    }


def test_the_prediction_reference_of_each_kind(references, training):
    regression = references["regression"]["prediction"]
    assert regression["kind"] == "regression" and "center" not in regression
    shares = torch.tensor(regression["expected"])
    assert shares.shape == (2, 10)  # deciles of each target
    assert torch.allclose(shares, torch.full_like(shares, 0.1), atol=0.002)

    multi = references["multi_label"]["prediction"]
    probabilities = answers("multi_label", training)
    positive = (probabilities >= 0.4).float().mean(dim=0)  # the answer's "labels" rule
    assert torch.tensor(multi["edges"]).flatten().tolist() == pytest.approx([0.4] * 4)
    assert torch.tensor(multi["expected"]) == pytest.approx(torch.stack([1 - positive, positive], dim=1), abs=1e-6)

    embedding = references["embedding"]["prediction"]
    vectors = answers("embedding", training)
    assert embedding["center"] == pytest.approx(vectors.mean(dim=0).tolist(), abs=1e-6)
    distances = torch.linalg.vector_norm(vectors - vectors.mean(dim=0), dim=1)
    deciles = torch.quantile(distances, torch.linspace(0, 1, 11)[1:-1])
    assert embedding["edges"] == [pytest.approx(deciles.tolist(), abs=1e-5)]  # deciles of the distance
    shares = torch.tensor(embedding["expected"])
    assert shares.shape == (1, 10)  # deciles of the distance to the center
    assert torch.allclose(shares, torch.full_like(shares, 0.1), atol=0.002)
    assert all("class_expected" not in r for r in references.values())


@pytest.mark.parametrize("kind", list(SIGNATURES))
def test_prediction_drift_is_low_on_training_like_rows_and_moves_when_the_inputs_shift(references, kind):
    g = torch.Generator().manual_seed(7)
    monitor = DriftMonitor(references[kind], window=2000)
    x = torch.randn(2000, 6, generator=g)
    monitor.update(x, answers(kind, x))
    calm = monitor.scores()
    assert calm.prediction < 0.05 and max(calm.outputs) < 0.05
    assert calm.prediction == pytest.approx(sum(calm.outputs) / len(calm.outputs))  # their mean
    assert len(calm.outputs) == {"regression": 2, "multi_label": 4, "embedding": 1}[kind]
    shifted = torch.randn(2000, 6, generator=g) + 3.0
    monitor.update(shifted, answers(kind, shifted))
    drift = monitor.scores()
    assert drift.prediction > 0.2
    assert drift.prediction == pytest.approx(sum(drift.outputs) / len(drift.outputs))


def test_the_embedding_drift_sees_a_move_orthogonal_to_the_training_mean(references):
    """Embeddings moved sideways (their cosine to the training mean barely changes): the distance grows."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(2000, 6, generator=g)
    vectors = answers("embedding", x)
    center = torch.tensor(references["embedding"]["prediction"]["center"])
    side = torch.randn(4, generator=g)
    side -= (side @ center) / (center @ center) * center  # orthogonal to the center
    side *= 2 * vectors.std(dim=0).norm() / side.norm()
    monitor = DriftMonitor(references["embedding"], window=2000)
    monitor.update(x, vectors)
    assert monitor.scores().prediction < 0.05
    monitor.update(x, vectors + side)
    assert monitor.scores().prediction > 0.2


@pytest.mark.parametrize("kind", list(SIGNATURES))
def test_output_window_counts_match_recomputation(references, kind):
    monitor = DriftMonitor(references[kind], window=500)
    g = torch.Generator().manual_seed(9)
    seen = []
    for size in [1, 7, 32, 200, 333, 499, 500, 501, 3, 64]:
        x = torch.randn(size, 6, generator=g) * 1.5
        monitor.update(x, answers(kind, x))
        seen.append(x)
        fresh = DriftMonitor(references[kind], window=500)
        recent = torch.cat(seen)[-500:]
        fresh.update(recent, answers(kind, recent))
        assert monitor.rows == fresh.rows
        assert torch.equal(monitor.out_counts, fresh.out_counts)
        assert monitor.scores().prediction == pytest.approx(fresh.scores().prediction, abs=1e-6)


def test_a_reference_without_the_predictions_scores_the_features_only(references):
    old = {k: v for k, v in references["regression"].items() if k != "prediction"}  # exported before it
    monitor = DriftMonitor(old, window=50)
    x = torch.randn(60, 6, generator=torch.Generator().manual_seed(10))
    monitor.update(x, answers("regression", x))
    scores = monitor.scores()
    assert scores.prediction is None and scores.outputs == [] and len(scores.features) == 6 and scores.rows == 50


def test_the_classifier_reference_has_no_prediction_block(reference):
    assert "prediction" not in reference and len(reference["class_expected"]) == 3
