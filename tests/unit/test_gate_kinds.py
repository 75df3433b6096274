"""The promotion gate per output kind (rtserve.promotion.gate, rtserve.promotion.kinds): the per-kind
thresholds of config/gate.yaml, the rows and their truth, the decision and its report for a regression,
a multi-label and an embedding model. Pure functions, no server (tests/integration/test_kinds.py runs
the gate on real archives)."""

from __future__ import annotations

import json
import zipfile

import pytest
import yaml

from rtserve.errors import ArchiveError, GateError
from rtserve.promotion.gate import (
    DEFAULT_CONFIG,
    ArchiveMeta,
    GateConfig,
    Measured,
    Row,
    comparison,
    decide,
    gate_rows,
)
from rtserve.promotion.kinds import Compare, KindThresholds, f1_per_label, regression_scale

pytestmark = pytest.mark.unit

CONFIG = GateConfig.load()
KINDS = CONFIG.kinds
LABELS = ["urgent", "billing", "spam"]


def measured(version, values, latency_ms=2.0):
    return Measured(version, list(values), [latency_ms] * 10)


def regression_meta(version, targets, width=1, labelled=True) -> ArchiveMeta:
    """A regression archive's meta: one golden row per target (features are not looked at)."""
    golden = {"features": [[float(i)] for i in range(len(targets))], "outputs": [[t] for t in targets]}
    golden["labels"] = list(targets) if labelled else None
    output = {"name": "y", "kind": "regression", "width": width}
    return ArchiveMeta(version, [], 1, golden, output)


def multi_meta(version, labels=LABELS, truth=None) -> ArchiveMeta:
    truth = truth if truth is not None else [[1, 0, 1], [0, 1, 0]]
    golden = {"features": [[0.0]] * len(truth), "labels": truth, "outputs": [[0.5] * len(labels)] * len(truth)}
    output = {"name": "t", "kind": "multi_label", "width": len(labels), "labels": labels, "threshold": 0.5}
    return ArchiveMeta(version, list(labels), 1, golden, output)


def embedding_meta(version, width=4) -> ArchiveMeta:
    golden = {"features": [[0.0], [1.0]], "labels": None, "outputs": [[0.0] * width] * 2}
    return ArchiveMeta(version, [], 1, golden, {"name": "v", "kind": "embedding", "width": width})


# -- config ------------------------------------------------------------------------------------------
def test_per_kind_sections_are_optional_typed_and_named(tmp_path):
    assert KINDS == KindThresholds(max_mae_increase=0.05, agreement_tolerance=0.25, max_f1_drop=0.02, min_cosine=0.95)
    raw = yaml.safe_load(DEFAULT_CONFIG.read_text())
    path = tmp_path / "gate.yaml"

    def load(change):
        copy = json.loads(json.dumps(raw))
        change(copy)
        path.write_text(yaml.safe_dump(copy))
        return GateConfig.load(path)

    def refused(change, message):
        with pytest.raises(GateError, match=message):
            load(change)

    def without_kinds(c):
        for section in ("regression", "multi_label", "embedding"):
            c.pop(section)

    old = load(without_kinds)  # a file written before the per-kind sections: the defaults
    assert old.kinds == KindThresholds() and old.thresholds() == CONFIG.thresholds()
    assert CONFIG.thresholds() == {"max_accuracy_drop": 0.01, "min_agreement": 0.9, "max_latency_ratio": 1.5}
    assert load(lambda c: c["regression"].pop("max_mae_increase")).kinds.max_mae_increase == 0.05
    assert load(lambda c: c["embedding"].update(min_cosine=0.5)).kinds.min_cosine == 0.5
    refused(
        lambda c: c["regression"].update(max_mae_increase=-0.1),
        r"regression.max_mae_increase must be a finite number of at least 0, got -0.1",
    )
    refused(
        lambda c: c["regression"].update(agreement_tolerance="wide"),
        r"regression.agreement_tolerance must be a finite number of at least 0, got 'wide'",
    )
    refused(
        lambda c: c["multi_label"].update(max_f1_drop=True), r"multi_label.max_f1_drop must be a number in \[0, 1\]"
    )
    refused(lambda c: c["embedding"].update(min_cosine=1.5), r"embedding.min_cosine must be a number in \[-1, 1\]")
    refused(lambda c: c["regression"].update(tolerance=1), r"regression: .* unknown \['tolerance'\]")
    refused(lambda c: c.update(embedding=0.9), r"embedding must be a mapping of any of \['min_cosine'\], got 0.9")
    refused(lambda c: c.update(ranking={}), r"unknown \['ranking'\]")
    assert CONFIG.thresholds("regression") == {
        "max_mae_increase": 0.05,
        "agreement_tolerance": 0.25,
        "min_agreement": 0.9,
        "max_latency_ratio": 1.5,
    }


# -- rows and their truth ----------------------------------------------------------------------------
def test_golden_truth_per_kind_and_rows():
    reg = regression_meta("1.0", [10.0, 20.0])
    assert reg.golden_labels() == [[10.0], [20.0]]
    two = ArchiveMeta(
        "1.0", [], 1, {"features": [[0.0]], "labels": [[1, 2.5]]}, {"name": "y", "kind": "regression", "width": 2}
    )
    assert two.golden_labels() == [[1.0, 2.5]]
    assert multi_meta("1.0").golden_labels() == [frozenset({"urgent", "spam"}), frozenset({"billing"})]
    assert embedding_meta("1.0").golden_labels() == [None, None]
    rows = gate_rows(reg, regression_meta("2.0", [30.0], labelled=False), [[5.0]])
    assert [(r.label, r.source) for r in rows] == [
        ([10.0], "golden 1.0"),
        ([20.0], "golden 1.0"),
        (None, "golden 2.0"),
        (None, "requests"),
    ]


@pytest.mark.parametrize(
    "default,candidate,message",
    [
        (
            regression_meta("1.0", [1.0, 2.0]),
            multi_meta("2.0"),
            "the default is 1.0 a regression model of width 1, the candidate 2.0 a multi_label model of width 3",
        ),
        (
            regression_meta("1.0", [1.0, 2.0]),
            regression_meta("2.0", [1.0, 2.0], width=2),
            "the default is 1.0 a regression model of width 1, the candidate 2.0 a regression model of width 2",
        ),
        (embedding_meta("1.0", 4), embedding_meta("2.0", 8), "embedding model of width 4, the candidate 2.0 a"),
        (
            multi_meta("1.0"),
            multi_meta("2.0", labels=["urgent", "spam", "billing"]),
            "the default 1.0's labels are ['urgent', 'billing', 'spam'], the candidate 2.0's "
            "['urgent', 'spam', 'billing']",
        ),
        (
            ArchiveMeta("1.0", ["a", "b"], 1, {"features": [[0.0]], "labels": None}),
            regression_meta("2.0", [1.0]),
            "the default is 1.0 a classification model of width 2, the candidate 2.0 a regression",
        ),
    ],
    ids=["kinds", "regression widths", "embedding widths", "multi-label labels", "classifier and regression"],
)
def test_versions_of_another_kind_or_width_are_refused_before_anything_is_measured(default, candidate, message):
    with pytest.raises(GateError) as info:
        gate_rows(default, candidate)
    assert message in str(info.value) and str(info.value).endswith("Nothing changed")


def test_a_classifier_may_still_add_a_class():
    """Classes are compared by name, as before the other kinds: a wider classifier is compared."""
    narrow = ArchiveMeta("1.0", ["a", "b"], 1, {"features": [[0.0]], "labels": [1]})
    wide = ArchiveMeta("2.0", ["a", "b", "c"], 1, {"features": [[0.0]], "labels": [2]})
    assert [r.label for r in gate_rows(narrow, wide)] == ["b", "c"]


def archive(tmp_path, golden, output) -> str:
    path = tmp_path / "m_1.0.mar"
    meta = {"version": "1.0", "labels": output.get("labels", []), "feature_names": ["x"], "golden": golden}
    meta["outputs"] = [output]
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("meta.json", json.dumps(meta))
        zf.writestr("MAR-INF/MANIFEST.json", json.dumps({"model": {"modelName": "m", "modelVersion": "1.0"}}))
    return path


def test_an_archives_golden_labels_are_checked_per_kind(tmp_path):
    reg = {"name": "y", "kind": "regression", "width": 1}
    good = archive(tmp_path, {"features": [[0.0], [1.0]], "labels": [1.5, 2], "outputs": [[1.0], [2.0]]}, reg)
    assert ArchiveMeta.from_mar(good).golden_labels() == [[1.5], [2.0]]
    for golden, output, message in (
        (
            {"features": [[0.0], [1.0]], "labels": [1.5, "x"], "outputs": [[1.0], [2.0]]},
            reg,
            "golden.labels[1] must be a finite number (the target) for a regression output of width 1, got 'x'",
        ),
        (
            {"features": [[0.0]], "labels": [[1, 0.5]], "outputs": [[0.1, 0.2]]},
            {"name": "t", "kind": "multi_label", "width": 2, "labels": ["a", "b"], "threshold": 0.5},
            "golden.labels[0] must be a list of 2 0/1 for a multi_label output of width 2, got [1, 0.5]",
        ),
        (
            {"features": [[0.0]], "labels": [1.0, 2.0], "outputs": [[1.0]]},
            reg,
            "golden.labels must be null or one entry per golden row (1)",
        ),
        (
            {"features": [[0.0]], "labels": [[1.0]], "outputs": [[1.0]]},
            {"name": "v", "kind": "embedding", "width": 1},
            "golden.labels must be null for an output of kind embedding (it has no truth), got a list",
        ),
    ):
        with pytest.raises(ArchiveError) as info:
            ArchiveMeta.from_mar(archive(tmp_path, golden, output))
        assert message in str(info.value)


def test_the_regression_scale_is_the_targets_spread():
    assert regression_scale({"labels": [1.0, 3.0], "outputs": [[0.0], [100.0]]}) == (1.0,)
    assert regression_scale({"labels": None, "outputs": [[0.0], [100.0]]}) == (50.0,)
    assert regression_scale({"labels": [[1.0, 5.0], [3.0, 5.0]]}) == (1.0, 5.0)  # constant: its mean
    assert regression_scale({"labels": [[0.0], [0.0]]}) == (1.0,)


# -- regression --------------------------------------------------------------------------------------
def regression_rows(targets):
    return [Row([0.0], [t], "golden") for t in targets]


@pytest.mark.parametrize("unit", [1.0, 1000.0], ids=["a target of about 1", "the same in thousands"])
def test_regression_mae_and_agreement_in_target_standard_deviations(unit):
    """The same answers in other units decide the same: tolerance and error are in target standard
    deviations (here the targets' spread is exactly ``unit``)."""
    targets = [unit * (-1.0 if i % 2 else 1.0) for i in range(100)]  # std = unit
    compare = comparison(regression_meta("1.0", targets), CONFIG)
    assert compare.scale == pytest.approx((unit,)) and compare.tolerance() == pytest.approx((0.25 * unit,))
    default = [(t + 0.1 * unit,) for t in targets]  # MAE 0.1 sd
    same = decide(CONFIG, "m", regression_rows(targets), measured("1", default), measured("2", default), compare)
    assert same.passed and same.kind == "regression" and same.accuracy is None
    assert same.quality["default"] == pytest.approx(0.1) and same.quality["increase"] == 0.0
    assert same.quality["mae"]["default"] == [pytest.approx(0.1 * unit)]

    at_limit = [(t + 0.15 * unit,) for t in targets]  # MAE 0.15 sd: 0.05 more, all within 0.25 sd
    report = decide(CONFIG, "m", regression_rows(targets), measured("1", default), measured("2", at_limit), compare)
    assert report.passed, report.failures
    assert report.quality["increase"] == pytest.approx(0.05) and report.agreement["value"] == 1.0

    worse = [(t + 0.16 * unit,) for t in targets]
    report = decide(CONFIG, "m", regression_rows(targets), measured("1", default), measured("2", worse), compare)
    assert [f.split(":")[0] for f in report.failures] == ["mean absolute error"]
    assert report.failures[0] == (
        "mean absolute error: the candidate's 0.1600 target standard deviations is 0.0600 above the "
        "default's 0.1000 (at most 0.05 allowed)"
    )


@pytest.mark.parametrize("far,passed", [(10, True), (11, False)], ids=["exactly min_agreement", "one row below"])
def test_regression_agreement_at_and_just_below_its_limit(far, passed):
    """100 unlabelled rows; ``far`` of the candidate's answers are 0.26 sd from the default's (the
    rest 0.24 sd: within the tolerance of 0.25 sd)."""
    targets = [10.0 * (-1.0 if i % 2 else 1.0) for i in range(100)]  # std 10
    compare = comparison(regression_meta("1.0", targets), CONFIG)
    rows = [Row([0.0], None, "requests") for _ in range(100)]
    default = [(0.0,)] * 100
    candidate = [(2.6,)] * far + [(-2.4,)] * (100 - far)
    report = decide(CONFIG, "m", rows, measured("1", default), measured("2", candidate), compare)
    assert report.agreement == {"value": (100 - far) / 100, "rows": 100, "on": "unlabelled rows", "tolerance": [2.5]}
    assert report.passed is passed and report.quality["rows"] == 0 and report.quality["default"] is None
    if not passed:
        assert report.failures == [
            "agreement: the candidate gives the default's value to within 0.25 target standard deviations "
            "on 0.8900 of the unlabelled rows (at least 0.9 required)"
        ]


def test_a_regression_report_text_and_record():
    targets = [1.0, -1.0] * 10
    compare = comparison(regression_meta("1.0", targets), CONFIG)
    answers = [(t,) for t in targets]
    report = decide(CONFIG, "m", regression_rows(targets), measured("1", answers), measured("2", answers), compare)
    text = report.text()
    assert "gate m: candidate 2 against default 1 (regression)" in text
    assert (
        "mean absolute error (20 labelled rows), in target standard deviations: default 0.0000, "
        "candidate 0.0000 (0 and 0 in target units), increase 0.0000 (max 0.05)"
    ) in text
    assert "agreement (20 rows (none unlabelled: all rows)): 100.00% (min 90.00%); values within 0.25" in text
    event = json.loads(json.dumps(report.event()))
    assert event["kind"] == "regression" and event["quality"]["metric"] == "mean absolute error"
    assert event["thresholds"] == CONFIG.thresholds("regression") and event["accuracy"] is None


def test_a_classifiers_record_keeps_its_keys():
    rows = [Row([0.0], "a", "golden")]
    report = decide(CONFIG, "m", rows, measured("1", ["a"]), measured("2", ["a"]))
    assert set(report.event()) == {
        "event",
        "action",
        "model",
        "default",
        "candidate",
        "accuracy",
        "agreement",
        "latency_ms",
        "thresholds",
        "failures",
        "passed",
        "outcome",
        "forced_by",
        "reason",
        "rows",
        "live",
    }
    assert report.agreement == {"value": 1.0, "rows": 1, "on": "rows (none unlabelled: all rows)"}


# -- multi-label -------------------------------------------------------------------------------------
def test_macro_f1_per_label():
    truth = [frozenset({"a"}), frozenset({"a", "b"}), frozenset()]
    predicted = [frozenset({"a"}), frozenset({"a"}), frozenset({"b"})]
    macro, per = f1_per_label(predicted, truth, ["a", "b", "c"])
    assert per == {"a": 1.0, "b": 0.0, "c": 1.0} and macro == pytest.approx(2 / 3)  # c: never true nor said


def test_multi_label_f1_drop_and_hamming_agreement():
    compare = comparison(multi_meta("1.0"), CONFIG)
    assert compare.labels == tuple(LABELS)
    truth = [frozenset({"urgent"}), frozenset({"billing", "spam"})] * 50
    rows = [Row([0.0], y, "golden") for y in truth]
    report = decide(CONFIG, "m", rows, measured("1", truth), measured("2", truth), compare)
    assert report.passed and report.quality["default"] == 1.0 and report.quality["drop"] == 0.0
    assert report.agreement["decisions"] == 300

    # one row of 100 loses "spam": spam's F1 is 2*49/(2*49+1) = 0.9899, the macro F1 0.9966
    one_off = list(truth)
    one_off[1] = frozenset({"billing"})
    report = decide(CONFIG, "m", rows, measured("1", truth), measured("2", one_off), compare)
    assert report.passed and report.quality["per_label"]["spam"]["candidate"] == pytest.approx(98 / 99, abs=1e-6)
    assert report.agreement["value"] == pytest.approx(1 - 1 / 300, abs=1e-6)  # one decision of 300

    # every billing row also says urgent: urgent's precision halves; 100 of 300 decisions differ
    noisy = [y | {"urgent"} for y in truth]
    report = decide(CONFIG, "m", rows, measured("1", truth), measured("2", noisy), compare)
    assert [f.split(":")[0] for f in report.failures] == ["macro F1", "agreement"]
    assert report.quality["candidate"] == pytest.approx((2 / 3 + 1 + 1) / 3, abs=1e-6)
    assert report.failures[1] == (
        "agreement: the candidate gives the default's decision per label on 0.8333 of the rows "
        "(none unlabelled: all rows) (at least 0.9 required)"
    )
    text = report.text()
    assert "macro F1 (100 labelled rows): default 1.0000, candidate 0.8889, drop 0.1111 (max 0.02)" in text
    assert "share of the 300 label decisions equal" in text


# -- embedding ---------------------------------------------------------------------------------------
def test_embedding_agreement_by_cosine_and_no_labelled_metric():
    compare = comparison(embedding_meta("1.0"), CONFIG)
    rows = [Row([0.0], None, "golden 1.0") for _ in range(10)]
    default = [(1.0, 0.0, 0.0, 0.0)] * 10
    close = [(1.0, 0.2, 0.0, 0.0)] * 10  # cosine 0.9806
    report = decide(CONFIG, "m", rows, measured("1", default), measured("2", close), compare)
    assert report.passed and report.quality is None and report.accuracy is None
    assert report.agreement["mean_cosine"] == pytest.approx(0.980581, abs=1e-6)
    far = close[:8] + [(0.0, 1.0, 0.0, 0.0), (1.0, 1.0, 0.0, 0.0)]  # cosines 0 and 0.7071
    report = decide(CONFIG, "m", rows, measured("1", default), measured("2", far), compare)
    assert report.agreement["value"] == 0.8 and not report.passed
    assert report.failures == [
        "agreement: the candidate gives a vector at cosine 0.95 or more to the default's on 0.8000 of "
        "the unlabelled rows (at least 0.9 required)"
    ]
    text = report.text()
    assert "no labelled metric for an embedding: the agreement only" in text
    assert "rows at cosine 0.95 or more (mean cosine 0.8552)" in text
    assert report.event()["thresholds"] == {"min_cosine": 0.95, "min_agreement": 0.9, "max_latency_ratio": 1.5}


def test_compare_of_a_format_1_archive_is_a_classifiers():
    assert Compare.of(None, {}) == Compare()
    assert Compare().agreeing() == "the default's class"
