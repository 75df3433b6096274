"""The sequence example end to end: `make example EXAMPLE_NAME=names` on a real TorchServe.

examples/names.py trains a character-level network on the surname lists Faker ships (five languages,
no download) and packages one named sequence input ``chars`` (ids, padding 0, at most 24); the Makefile
trains, checks and archives it. Names of different lengths sent at once share batches the server cuts
after its longest name: every answer must equal the model run in this process on that name alone
(1e-5), over rtserve's body, KServe v1 and OIP v2. Hostile sequences get their 400s among valid
traffic, the gate refuses a candidate trained on shuffled labels and promotes a retrain, drift moves
when the names change, and explanations of ids are refused with a 501 saying why.
"""

from __future__ import annotations

import json
import random
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from bench import hostile_input  # worker_pids
from examples.names import INPUT, LOCALES, MAX_LENGTH, encode, holdout_accuracy, load_data, packaging
from tests.integration.examples import gate_verdicts, post, served_example, settled

pytestmark = pytest.mark.integration

NAME = "names"
DRIFT_WINDOW = 300
CANDIDATES = {"2.0": {"seed": 1}, "3.0": {"shuffle_labels": True}}
#: Real surnames of each language, of many lengths.
SAMPLES = [
    "Müller",
    "Schwarzenegger",
    "Dubois",
    "Lefèvre",
    "Esposito",
    "Bianchi",
    "García",
    "Fernández",
    "de Vries",
    "Jansen",
]


@pytest.fixture(scope="module")
def example(build_root, mar_v1, tmp_path_factory):
    """(server, the eager 1.0 trained here, {version: archive}, alphabet): 1.0 built by `make example`."""
    with served_example(NAME, packaging, CANDIDATES, build_root, mar_v1, tmp_path_factory, DRIFT_WINDOW) as (ts, mars):
        yield ts, packaging()["model"], mars, load_data()[4]


def alone(model, ids: list[int]) -> list[float]:
    """The model's probabilities for one name, unpadded."""
    with torch.inference_mode():
        return torch.softmax(model(torch.tensor([ids])), dim=1)[0].tolist()


def test_names_of_any_length_answer_as_each_alone(example):
    server, model, _, alphabet = example
    _, _, x_test, _, _ = load_data()
    names = [row[row != 0].tolist() for row in x_test[:60]] + [encode(n, alphabet) for n in SAMPLES]
    assert len({len(ids) for ids in names}) > 8  # many lengths, sent at once: batches mix them

    def ask(ids):
        response = post(server, f"predictions/{NAME}", {INPUT: ids})
        assert response.status_code == 200, response.text
        return response.json()

    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(ask, names))
    for ids, body in zip(names, answers):
        assert body["probabilities"] == pytest.approx(alone(model, ids), abs=1e-5)
    print({name: body["label"] for name, body in zip(SAMPLES, answers[-len(SAMPLES) :])})
    right = sum(
        body["label"] == lang for body, lang in zip(answers[-len(SAMPLES) :], [*[k for k in LOCALES for _ in (0, 1)]])
    )
    assert right >= 5  # the model reads the names: chance is 2 of 10
    v1 = post(server, f"v1/models/{NAME}:predict", {"instances": [{INPUT: ids} for ids in names[:5]]})
    assert v1.status_code == 200, v1.text
    for ids, got in zip(names[:5], v1.json()["predictions"]):
        assert got["probabilities"] == pytest.approx(alone(model, ids), abs=1e-5)
    longest = max(len(ids) for ids in names[:5])
    padded = [ids + [0] * (longest - len(ids)) for ids in names[:5]]
    v2 = post(
        server,
        f"v2/models/{NAME}/infer",
        {"inputs": [{"name": INPUT, "datatype": "INT64", "shape": [5, longest], "data": padded}]},
    )
    assert v2.status_code == 200, v2.text
    data = {o["name"]: o for o in v2.json()["outputs"]}["probabilities"]["data"]
    assert data == pytest.approx([p for ids in names[:5] for p in alone(model, ids)], abs=1e-5)
    assert holdout_accuracy(model) > 0.6  # five languages: the largest is 28% of the names


def hostile(rng: random.Random, vocabulary: int) -> dict | bytes:
    """One bad body for the sequence input (raw bytes: not JSON at all)."""
    good = [rng.randrange(2, vocabulary) for _ in range(rng.randrange(1, MAX_LENGTH))]
    kind = rng.randrange(8)
    if kind == 7:
        return rng.choice([b"", b"chars=1,2", json.dumps({INPUT: good}).encode()[:-3], b"\xff\xfe"])
    if kind == 0:
        return {INPUT: good + [2] * (MAX_LENGTH + 1 - len(good))}  # one too long
    if kind == 1:
        return {INPUT: []}
    if kind == 2:
        return {INPUT: good[:-1] + [vocabulary + rng.randrange(100)]}
    if kind == 3:
        return {INPUT: good[:-1] + [rng.choice([-1, 2.5, True, None, "a", [3]])]}
    if kind == 4:
        return {INPUT: rng.choice(["Müller", 7, {"b64": "AA=="}, None])}
    if kind == 5:
        return {"characters": good}
    return {INPUT: [good]}  # nested one level too deep


def test_hostile_sequences_get_400s_mixed_with_valid_traffic(example):
    server, _, _, alphabet = example
    pids = hostile_input.worker_pids(server, NAME)
    rng = random.Random(0)
    vocabulary = len(alphabet) + 2
    items = [(hostile(rng, vocabulary), False) for _ in range(160)]
    items += [({INPUT: encode(SAMPLES[i % len(SAMPLES)], alphabet)}, True) for i in range(160)]
    rng.shuffle(items)

    def send(item):
        body, valid = item
        data = body if isinstance(body, bytes) else None
        response = post(server, f"predictions/{NAME}", None if data is not None else body, data=data)
        return valid, response.status_code, response.json()

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(send, items))
    assert all(status == 200 for valid, status, _ in results if valid)
    bad = [(status, body) for valid, status, body in results if not valid]
    assert all(status == 400 for status, _ in bad), [x for x in bad if x[0] != 400][:5]
    # each names what is wrong: the sequence input (and its index), or the body itself
    named = [body for _, body in bad if body.get("field", "").startswith(INPUT) or "request body" in body["error"]]
    assert len(named) == len(bad), [body for _, body in bad if body not in named][:5]
    reasons = {body["error"].split(" must ")[0] for _, body in bad}
    assert len(reasons) > 5, reasons
    assert hostile_input.worker_pids(server, NAME) == pids


def test_the_gate_refuses_shuffled_labels_and_promotes_a_retrain(example):
    server, _, mars, _ = example
    refused, promoted = gate_verdicts(server, mars, NAME)
    assert {f.split(":")[0] for f in refused.failures} >= {"accuracy"}
    assert promoted["outcome"] == "promoted"


def test_drift_moves_when_the_names_change_and_ids_are_not_explained(example):
    server, _, _, alphabet = example
    x_train = load_data()[0]

    def fill(rows):
        for start in range(0, len(rows), 50):
            instances = [{INPUT: row[row != 0].tolist()} for row in rows[start : start + 50]]
            response = post(server, f"v1/models/{NAME}:predict", {"instances": instances})
            assert response.status_code == 200, response.text

    fill(x_train[:DRIFT_WINDOW])
    low = settled(server, "rtserve_prediction_drift_psi", NAME)[""]
    shouting = x_train[:DRIFT_WINDOW].clone()
    shouting[:, :4] = torch.where(shouting[:, :4] != 0, torch.tensor(encode("z", alphabet)[0]), 0)  # "zzzz..."
    fill(shouting)
    high = settled(server, "rtserve_prediction_drift_psi", NAME)[""]
    positions = settled(server, "rtserve_feature_drift_psi", NAME)
    print(
        "prediction PSI on training names", low, "on names starting zzzz", high, "position 0", positions[f"{INPUT}[0]"]
    )
    print("length PSI", positions[f"{INPUT}.length"], "token shares PSI", positions[f"{INPUT}.tokens"])
    assert low < 0.1 and high > 0.2 and positions[f"{INPUT}[0]"] > 0.2 and positions[f"{INPUT}.tokens"] > 0.2
    assert positions[f"{INPUT}.length"] < 0.1  # the names kept their lengths
    response = post(server, f"explanations/{NAME}", {INPUT: encode("Müller", alphabet)})
    assert response.status_code == 501, response.text
    assert "'chars' (int64) are not float32" in json.loads(response.text)["error"]
