"""Safe promotion on a real TorchServe: the golden set at register, the gate at promote.

The candidates are real archives built by `make archive ... ARTIFACTS=<dir>` from modules defined
here and packaged with rtserve.model.package.export (the demo's held-out set as their golden set):

- 2.0: the demo's larger model (a good candidate: promoted);
- 3.1: the demo 1.0 network with its output columns shuffled (its labels are wrong);
- 4.1: the demo 1.0 network fed features normalized with the wrong statistics;
- 5.1: the demo 1.0 network plus a large dummy matmul in forward (same answers, slower);
- 6.1: a copy of the served 1.0 archive whose golden set was altered after packaging.

All share the module's one server (1.0 the default); thresholds come from config/gate.yaml, only
the burst is shortened. (Versions x.1: test_versions uses x.0 of the same session model store.)
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from torch import nn

from rtserve.model.data import FEATURE_NAMES, LABELS, make_dataset
from rtserve.model.package import export
from rtserve.promotion.gate import ArchiveMeta, GateConfig
from rtserve.promotion.history import HISTORY_FILE, History
from rtserve.promotion.measure import GoldenMismatch
from rtserve.promotion.rollout import GateRefused, Rollout, Verification
from tests.conftest import MODEL_NAME, REPO, make_archive
from tests.helpers import demo_eager, keep_only
from tests.unit.test_package import rewrite

pytestmark = pytest.mark.integration

#: config/gate.yaml with a shorter measurement (thresholds unchanged).
CONFIG = dataclasses.replace(GateConfig.load(), burst_requests=100, warmup_requests=5, concurrency=8)
ALTERED_ROWS = [3, 7]


class ShuffledLabels(nn.Module):
    """The demo network with its output columns permuted: every label means another class."""

    def __init__(self, base: nn.Module) -> None:
        super().__init__()
        self.base = base
        self.register_buffer("order", torch.tensor([1, 2, 0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x)[:, self.order]


class WrongNormalization(nn.Module):
    """The demo network after centering only (the per-feature scale is forgotten)."""

    def __init__(self, base: nn.Module) -> None:
        super().__init__()
        self.base = base

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base.net(x - self.base.norm.mean)


class Slowed(nn.Module):
    """The demo network plus large matmuls whose result is multiplied by zero: same answers,
    tens of milliseconds more per batch (a legit torch.export program, no sleep)."""

    def __init__(self, base: nn.Module, size: int = 1024) -> None:
        super().__init__()
        self.base = base
        self.register_buffer("weight", torch.randn(size, size, generator=torch.Generator().manual_seed(0)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        waste = (self.weight @ self.weight @ self.weight).sum() * 0.0
        return self.base(x) + waste


@pytest.fixture(scope="module")
def store(build_root, mar_v1, tmp_path_factory):
    """The model store holding 1.0 (served) and the candidates 2.0 to 6.1."""
    root = tmp_path_factory.mktemp("candidates")
    data = make_dataset()
    base = demo_eager("1.0")
    candidates = {"3.1": ShuffledLabels(base), "4.1": WrongNormalization(base), "5.1": Slowed(base)}
    for version, model in candidates.items():
        export(
            model,
            data.x_train,
            feature_names=FEATURE_NAMES,
            labels=LABELS,
            version=version,
            out_dir=root / version,
            holdout=(data.x_test, data.y_test),
        )
    with ThreadPoolExecutor(max_workers=2) as pool:  # `make archive` runs are independent
        jobs = [pool.submit(make_archive, build_root, "2.0")]
        jobs += [pool.submit(make_archive, build_root, v, ARTIFACTS=str(root / v)) for v in candidates]
        for job in jobs:
            job.result()

    def alter(name: str, raw: bytes) -> bytes:
        if name == "MAR-INF/MANIFEST.json":
            manifest = json.loads(raw)
            manifest["model"]["modelVersion"] = "6.1"
            return json.dumps(manifest).encode()
        if name != "meta.json":
            return raw
        meta = json.loads(raw)
        meta["version"] = "6.1"
        for row in ALTERED_ROWS:
            meta["golden"]["probabilities"][row] = meta["golden"]["probabilities"][row][::-1]
        return json.dumps(meta).encode()

    rewrite(mar_v1, mar_v1.parent / f"{MODEL_NAME}_6.1.mar", alter)
    requests = root / "requests.jsonl"  # production-like bodies: held-out rows past the golden set
    requests.write_text("".join(json.dumps({"features": x}) + "\n" for x in data.x_test[300:500].tolist()))
    return mar_v1.parent, requests


@pytest.fixture()
def rollout(server, store):
    history = History(server.run_dir / HISTORY_FILE)
    history.path.unlink(missing_ok=True)
    audit = server.run_dir / "logs" / "audit.log"
    ro = Rollout(server.client(timeout=120), history, MODEL_NAME, Verification(store[0], CONFIG, audit))
    yield ro
    keep_only(ro)  # leave the module's server as the fixture made it


#: What every gate decision records: versions, figures, thresholds, outcome, who forced it and why.
GATE_KEYS = {
    "model",
    "default",
    "candidate",
    "accuracy",
    "agreement",
    "latency_ms",
    "rows",
    "thresholds",
    "failures",
    "passed",
    "outcome",
    "forced_by",
    "reason",
    "live",
    "at",
}


def history_lines(server) -> list[dict]:
    """The rollout history file, parsed line by line: each line is one JSON object on its own."""
    path = server.run_dir / HISTORY_FILE
    lines = path.read_text().splitlines()
    parsed = [json.loads(line) for line in lines]
    assert all(isinstance(e, dict) for e in parsed) and parsed == History(path).events()
    return parsed


def last_gate_records(server) -> tuple[dict, dict]:
    """The last gate decision: its line in the rollout history and its line in the audit log, the
    same record, with every figure the decision used."""
    history = [e for e in history_lines(server) if e["action"] == "gate"]
    lines = (server.run_dir / "logs" / "audit.log").read_text().splitlines()
    audit = [json.loads(line) for line in lines if '"event":"gate"' in line]
    assert set(history[-1]) == GATE_KEYS | {"event", "action"}
    assert history[-1] == audit[-1]
    assert history[-1]["thresholds"] == CONFIG.thresholds()
    latency = history[-1]["latency_ms"]
    assert latency["default"]["p99"] > 0 and latency["candidate"]["p99"] > 0 and latency["ratio"] > 0
    return history[-1], audit[-1]


def test_register_unregisters_a_version_whose_golden_set_differs(rollout):
    with pytest.raises(GoldenMismatch) as info:
        rollout.register("6.1", workers=1)
    assert f"answers {len(ALTERED_ROWS)} of " in str(info.value)
    assert f"rows {ALTERED_ROWS}" in str(info.value)
    assert "was unregistered again, the default is unchanged" in str(info.value)
    assert rollout.versions() == ["1.0"]


@pytest.mark.parametrize(
    "version,expected,requests",
    [
        ("4.1", {"accuracy", "agreement"}, True),
        ("5.1", {"latency"}, False),
    ],
)
def test_gate_refuses_a_bad_candidate_and_changes_nothing(rollout, server, store, version, expected, requests):
    rollout.register(version, workers=1)  # it answers its own golden set: register accepts it
    if version == "5.1":  # tens of ms slower per batch: one burst decides, no re-measuring
        rollout.verification = dataclasses.replace(
            rollout.verification, config=dataclasses.replace(CONFIG, latency_attempts=1)
        )
    with pytest.raises(GateRefused) as info:
        rollout.promote(version, requests_file=store[1] if requests else None)
    report = info.value.report
    found = {f.split(":")[0] for f in report.failures}
    # its own reasons; the slowed one (same answers) on latency alone. A wrong one may also be
    # slower on this busy machine: latency is not what the test is about for it.
    assert expected <= found if "latency" not in expected else found == expected, report.text()
    assert rollout.default_version() == "1.0"
    assert [e["action"] for e in history_lines(server)] == ["gate"]  # the decision, no change
    history, audit = last_gate_records(server)
    assert history["outcome"] == audit["outcome"] == "refused"
    assert (history["candidate"], history["failures"]) == (version, report.failures)
    assert audit["thresholds"] == CONFIG.thresholds()
    if requests:
        assert report.rows["requests"] == 200 and report.agreement["on"] == "unlabelled rows"


def test_good_candidate_passes_and_is_promoted(rollout, server, store):
    rollout.register("2.0", workers=1)
    assert rollout.promote("2.0", requests_file=store[1]) == "1.0"
    assert rollout.default_version() == "2.0"
    history, audit = last_gate_records(server)
    assert history["outcome"] == audit["outcome"] == "promoted" and history["failures"] == []
    assert history["forced_by"] is None and history["reason"] is None
    assert [e["action"] for e in history_lines(server)] == ["gate", "promote"]
    assert history["accuracy"]["candidate"] >= history["accuracy"]["default"] - CONFIG.max_accuracy_drop
    assert rollout.history.previous_default(MODEL_NAME) == "1.0"


def test_make_promote_refuses_then_force_records_its_reason(rollout, server, store, build_root):
    """`make register` registers the candidate `make archive ... ARTIFACTS=<dir>` built, as it is
    (ARTIFACTS not restated); `make promote` refuses this shuffled-label candidate with the report
    and changes nothing; FORCE=1 REASON=... promotes it, and the reason and who forced it are
    recorded."""
    props = server.props
    variables = [
        f"MODEL_STORE={store[0]}",
        f"DEMO_ARTIFACTS={build_root / 'artifacts'}",
        f"RUN_DIR={server.run_dir}",
        f"INFERENCE_URL={props['inference_address']}",
        f"MANAGEMENT_URL={props['management_address']}",
        "MODEL_VERSION=3.1",
    ]

    def make(target: str, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["make", "-s", target, *variables, *extra],
            cwd=REPO,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=300,
        )

    def promote(*extra: str) -> subprocess.CompletedProcess:
        return make("promote", *extra)

    archive = store[0] / f"{MODEL_NAME}_3.1.mar"
    packed = archive.read_bytes()
    registered = make("register", "WORKERS=1")
    assert registered.returncode == 0 and "registered with" in registered.stdout, registered.stdout
    assert archive.read_bytes() == packed  # not rebuilt from the demo's rules
    assert rollout.versions() == ["1.0", "3.1"] and rollout.default_version() == "1.0"
    refused = promote()
    assert refused.returncode != 0 and "FAILED accuracy" in refused.stdout, refused.stdout
    assert "was not promoted; nothing changed" in refused.stdout
    assert rollout.default_version() == "1.0"
    history, audit = last_gate_records(server)
    assert history["outcome"] == audit["outcome"] == "refused"
    reason = "labels remapped on purpose by the data team (ticket 42)"
    forced = promote("FORCE=1", f"REASON={reason}")
    assert forced.returncode == 0, forced.stdout
    assert "default: 1.0 -> 3.1" in forced.stdout and "FAILED accuracy" in forced.stdout
    assert rollout.default_version() == "3.1"
    history, audit = last_gate_records(server)
    assert history["outcome"] == audit["outcome"] == "forced"
    assert history["reason"] == audit["reason"] == reason and history["forced_by"]
    # one line per decision: the refused one, the forced one, then the default change itself
    assert [e["action"] for e in history_lines(server)] == ["gate", "gate", "promote"]
    assert (history["default"], history["candidate"], history["passed"]) == ("1.0", "3.1", False)
    assert promote("FORCE=1").returncode != 0  # a forced promotion needs a reason


@pytest.mark.parametrize("version,ok", [("1.0", True), ("6.1", False)])
def test_verify_command_checks_what_a_url_serves(server, store, tmp_path, version, ok):
    """`python -m rtserve versions verify` (what the Kubernetes Job runs) against the served default, with a
    token file like the gateway Secret's: its own archive passes, an archive it does not match fails."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# shared tokens\n{server.client().keys.get('inference')}\n")
    done = subprocess.run(
        [
            str(REPO / ".venv" / "bin" / "python"),
            "-m",
            "rtserve",
            "versions",
            "--inference",
            server.props["inference_address"],
            "--run-dir",
            str(tmp_path),
            "verify",
            MODEL_NAME,
            "--archive",
            str(store[0] / f"{MODEL_NAME}_{version}.mar"),
            "--token-file",
            str(tokens),
        ],
        cwd=REPO,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=300,
    )
    if ok:
        assert done.returncode == 0, done.stdout
        figures = json.loads(done.stdout.split("verified ", 1)[1])
        golden = ArchiveMeta.from_mar(store[0] / f"{MODEL_NAME}_{version}.mar").golden
        assert figures["golden_rows"] == len(golden["features"]) > 0
        assert figures["p99_ms"] <= figures["max_p99_ms"] == CONFIG.max_p99_ms
    else:
        assert done.returncode == 1 and f"rows {ALTERED_ROWS}" in done.stdout, done.stdout


def test_verify_measures_a_slow_burst_again_and_fails_only_when_every_burst_is_slow(server, store, tmp_path):
    """A p99 over `--max-p99-ms` is measured again, up to the gate config's `latency_attempts`
    bursts (one stall of a busy node must not roll a good version back); over the limit in every
    burst, the command fails and names each burst's p99."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{server.client().keys.get('inference')}\n")
    done = subprocess.run(
        [
            str(REPO / ".venv" / "bin" / "python"),
            "-m",
            "rtserve",
            "versions",
            "--inference",
            server.props["inference_address"],
            "--run-dir",
            str(tmp_path),
            "verify",
            MODEL_NAME,
            "--archive",
            str(store[0] / f"{MODEL_NAME}_1.0.mar"),
            "--token-file",
            str(tokens),
            "--max-p99-ms",
            "0.001",
        ],
        cwd=REPO,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=300,
    )
    assert done.returncode == 1, done.stdout
    assert f"above max_p99_ms 0.001 ms in each of {CONFIG.latency_attempts} bursts" in done.stdout, done.stdout
    attempts = json.loads(done.stdout.split("'attempts_p99_ms': ", 1)[1].split("]", 1)[0] + "]")
    assert len(attempts) == CONFIG.latency_attempts and min(attempts) > 0.001
