"""Shadow and canary in the cluster (`make k8s-shadow`, `k8s-shadow-report`, `k8s-canary`,
`k8s-live-stop`): a candidate as its own Deployment and Service beside the local overlay's 1.0
(3.2, a network that answers at random as a model trained on shuffled labels does; then the
demo's 2.0), the routes through the ConfigMap rtserve-live-routes and straight into the default pods, the
pods' logs read back through kubectl exec. Traffic goes to the default Service's cluster IP from
this machine, as in test_deploy.py; 1.0 is deployed first when a test before left another
version serving or no namespace (:meth:`tests.cluster.conftest.Served.ensure`). The autoscaler is
held at its 2 replicas meanwhile (test_deploy.py proves it scales), and the module ends once the
Deployment is back at 2 ready replicas."""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import pytest
import requests
import yaml

from bench import pod_rollout
from bench.loadgen import SteadyLoad
from rtserve.k8s.deploy import Kubectl
from rtserve.promotion.live.kubectl import POD_RUN, POD_TOKEN_FILE, LogCopy
from rtserve.promotion.live.kubectl import Cluster as LivePods
from rtserve.promotion.live.routes import KEY_HEADER, Route, Routes, sticky_bucket
from tests.cluster.conftest import DEPLOY_TIMEOUT, NAMESPACE, RATE, autoscaler_held, deploy, make, no_failures
from tests.conftest import MODEL_NAME, REPO
from tests.helpers import SLOW_CANDIDATE, SLOW_S, Reference, agreement, demo_eager, random_archive, shadow_cost

pytestmark = pytest.mark.cluster

PERCENT = 10.0
#: The shuffled candidate's shadow share, over SHADOWED requests of the held-out rows.
SHADOW_PERCENT = 50.0
SHADOWED = 2000
#: The compared requests the shuffled candidate's report needs (and its refused promotion asks).
EVIDENCE_FLOOR = 300
#: The held-out rows 2.0's shadow sends in turn (the evidence of its promotion).
HELD_OUT = 400
#: The mirrored requests both versions answered that a promotion requires (2.0's shadow under the
#: steady load gives about 800).
EVIDENCE_REQUESTS = 200
#: The slow stand-in's steady load (requests per second, connections), its windows of each
#: condition and their length (s), and the measurements at most (as tests/integration's).
SLOW_RATE, SLOW_CONNECTIONS = 40.0, 4
WINDOWS, WINDOW_S, ATTEMPTS = 4, 5.0, 3
#: The most the callers' p99 may move however noisy the node (30 % of the stand-in's delay: a
#: caller held by a mirror would wait all 500 ms), as tests/integration/test_live_routes.py.
MAX_ALLOWED_MS = 0.3 * SLOW_S * 1000
#: The stand-in that answers every request after 500 ms: its pod and Service.
SLOW = "rtserve-slow-stand-in"
#: Keys of the canary's traffic: 2,000 clients, each sending twice (4,000 requests).
KEYS = [f"user-{i}" for i in range(2000)]
#: Seconds to wait for the watcher's abort once the candidate is gone.
ABORT_WAIT_S = 120


def gate_config(tmp_path: Path) -> Path:
    """config/gate.yaml with a canary window that fits the test: 30 s, 20 answers; the p99
    bound (the default pods' round trip to the candidate on this loaded 2-core node) and the
    agreement are left out of it (the abort under test is the error rate's)."""
    config = yaml.safe_load((REPO / "config" / "gate.yaml").read_text())
    config["live"]["canary"].update(
        window_s=30.0, min_requests=20, max_error_rate=0.05, max_p99_ms=60000.0, min_agreement=0.0
    )
    path = tmp_path / "gate.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def keyed(served, keys: list[str], concurrency: int = 8, rows: list[list[float]] | None = None) -> list[dict]:
    """One request per key (``x-rtserve-key``), ``concurrency`` at a time: status, version, id.
    The features are ``rows[i]`` for the i-th key (default: one constant row for all)."""
    bodies = [json.dumps({"features": row}) for row in rows] if rows else [json.dumps({"features": [0.25] * 32})]
    headers = {**served.auth, "Content-Type": "application/json"}

    local = threading.local()  # a session per sender thread

    def one(item: tuple[int, str]) -> dict:
        i, key = item
        session = local.__dict__.setdefault("session", requests.Session())
        sent = time.time()
        try:
            r = session.post(served.url, data=bodies[i % len(bodies)], timeout=30, headers={**headers, KEY_HEADER: key})
            version = r.json().get("model_version") if r.status_code == 200 else None
            return {
                "key": key,
                "status": r.status_code,
                "version": version,
                "at": sent,
                "id": r.headers.get("x-request-id"),
                "text": "" if r.status_code == 200 else r.text[:200],
            }
        except requests.RequestException as exc:
            return {"key": key, "status": 0, "version": None, "at": sent, "id": None, "text": str(exc)[:200]}

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, enumerate(keys)))


def pod_routes(served) -> dict[str, dict]:
    """Each default pod's routes file, as the agent reads it."""
    return {
        pod: json.loads(served.deployed.exec(pod, "rtserve", "cat", "/home/model-server/run/live-routes.json"))
        for pod in served.pods()
    }


@pytest.fixture(scope="module")
def held(served):
    """1.0 serving (:meth:`Served.ensure`: deployed again when a test before left 2.0 or removed
    the namespace), the autoscaler held at 2 replicas for the module; afterwards its maximum is
    restored and 2 replicas are ready."""
    served.ensure()  # (before the HPA is held: a deploy applies it as the overlay has it)
    try:
        with autoscaler_held(served):
            yield served
    finally:
        served.deployed.wait_ready(2, timeout=240)


def live_vars(served, image_vars, state: Path) -> list[str]:
    return ["OVERLAY=local", f"K8S_LIVE_DIR={state}", *served.cluster.make_vars, *image_vars]


def test_a_shuffled_candidate_shadowed_at_half_agrees_by_chance_and_its_promotion_is_refused(
    held, image_vars, build_root, mar_v1, tmp_path
):
    """3.2 (:class:`tests.helpers.RandomAnswers`, its own image and Deployment) shadowed at 50 %
    under 2,000 requests of the held-out rows: callers see 1.0 only, 50 % of them are mirrored
    (within 2 points), the agreement is chance's, and `make k8s-deploy` with the live evidence
    required refuses 3.2 naming its agreement."""
    served, cluster = held, held.cluster
    random_archive(build_root, tmp_path, "3.2", mar_v1.parent)  # into the session's model store
    state = tmp_path / "live"
    live = live_vars(served, image_vars, state)
    try:
        begin = time.monotonic()
        shadow = make("k8s-shadow", "MODEL_VERSION=3.2", f"PERCENT={SHADOW_PERCENT:g}", *live, timeout=DEPLOY_TIMEOUT)
        took = time.monotonic() - begin
        assert shadow.returncode == 0, shadow.stdout[-4000:]
        print(
            f">> make k8s-shadow MODEL_VERSION=3.2 PERCENT={SHADOW_PERCENT:g} ({took:.0f} s: image "
            "build and load, candidate rollout):\n" + "\n".join(shadow.stdout.splitlines()[-6:])
        )
        from rtserve.model.data import make_dataset

        rows = make_dataset().x_test[:SHADOWED].tolist()
        begin = time.monotonic()
        answers = keyed(served, [f"row-{i}" for i in range(SHADOWED)], concurrency=4, rows=rows)
        sent_s = time.monotonic() - begin
        assert {(a["status"], a["version"]) for a in answers} == {(200, "1.0")}, [
            a for a in answers if (a["status"], a["version"]) != (200, "1.0")
        ][:5]
        report = make("k8s-shadow-report", *live, timeout=120)
        assert report.returncode == 0, report.stdout[-3000:]
        print(report.stdout[-2500:])
        saved = json.loads((state / "shadow-report.json").read_text())
        ours = {a["id"] for a in answers}
        lines = [json.loads(line) for line in (state / "report" / "live-log.jsonl").read_text().splitlines()]
        mirrored = [line for line in lines if line["kind"] == "shadow" and line["of"] in ours]
        share = len(mirrored) / len(answers) * 100
        shares = {who: {k: v / sum(c.values()) for k, v in c.items()} for who, c in saved["classes"].items()}
        chance = sum(p * shares["candidate"].get(k, 0.0) for k, p in shares["default"].items())
        print(
            f"shadow 3.2 at {SHADOW_PERCENT:g}%: {len(mirrored)} of {len(answers)} requests mirrored "
            f"({share:.2f}%) in {sent_s:.0f} s ({saved['dropped']} dropped at the agent's in-flight "
            f"limit); agreement {saved['agreement']:.4f} over {saved['compared']} compared, chance {chance:.4f}"
        )
        assert abs(share - SHADOW_PERCENT) <= 2.0, share
        # (the agent drops a mirror beyond 64 in flight, logged as such: on a busy node the
        # candidate's answers slow down; the share counts every request the agent chose)
        assert saved["candidate"] == "3.2" and saved["compared"] >= EVIDENCE_FLOOR, saved
        assert abs(saved["agreement"] - chance) < 0.1 and saved["agreement"] < 0.6, (saved, chance)

        # -- promotion with live.promote.require_shadow: refused on the agreement ------------------
        refused = deploy(
            cluster,
            image_vars,
            "3.2",
            f"K8S_LIVE_DIR={state}",
            f"GATE_CONFIG={evidence_config(tmp_path, EVIDENCE_FLOOR)}",
            timeout=300,
        )
        print(">> make k8s-deploy 3.2 (live evidence refused):\n" + "\n".join(refused.stdout.splitlines()[-3:]))
        assert refused.returncode != 0
        assert re.search(
            r"error: live evidence: live agreement: the candidate gave the default's class on "
            r"0\.\d+ of \d+ mirrored requests \(at least 0\.9 required\).*nothing applied",
            refused.stdout,
        ), refused.stdout[-2000:]
        assert served.versions() == {"1.0"}
        assert [e["outcome"] for e in evidence_events(state)] == ["refused"]
    finally:
        stopped = make("k8s-live-stop", *live, timeout=300)
    assert stopped.returncode == 0, stopped.stdout[-3000:]


def slow_stand_in() -> dict:
    """A pod of the 1.0 image (already on the node) running :data:`tests.helpers.SLOW_CANDIDATE`
    on port 8080, as restricted Pod Security admits it, and its Service. A fake candidate, and
    said so: no real model can be told to answer 500 ms later. It carries the candidate's name
    label (the candidate's NetworkPolicies, :func:`candidate_policies`, let the default pods reach
    it) but not the candidate Service's component label."""
    labels = {"app.kubernetes.io/name": "rtserve-candidate", "rtserve.io/stand-in": "slow"}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": SLOW, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "automountServiceAccountToken": False,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 10001,
                "runAsGroup": 10001,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "slow",
                    "image": "registry.example.com/ml/rtserve:1.0",
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python", "-c", SLOW_CANDIDATE, "0.0.0.0", "8080"],
                    "ports": [{"name": "inference", "containerPort": 8080}],
                    "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
                    "resources": {
                        "requests": {"cpu": "100m", "memory": "128Mi"},
                        "limits": {"cpu": "500m", "memory": "128Mi"},
                    },
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": SLOW, "namespace": NAMESPACE},
        "spec": {
            "selector": {"rtserve.io/stand-in": "slow"},
            "ports": [{"name": "inference", "port": 8080, "targetPort": "inference"}],
        },
    }
    return {"apiVersion": "v1", "kind": "List", "items": [pod, service]}


#: How long a new pod may take to be reachable through the policies once it is Ready.
POLICY_OPEN_S = 60.0


def open_from_each(served, host: str, port: int) -> float:
    """Wait until ``host:port`` accepts a connection from each of the served pods (from their
    rtserve container, 2 s connect timeout); returns the seconds waited.

    Raises:
        AssertionError: a pod still cannot connect after :data:`POLICY_OPEN_S`.
    """
    connect = f"import socket; socket.create_connection(({host!r}, {port}), 2).close()"
    start = time.monotonic()
    for pod in served.pods():
        while True:
            done = served.cluster.kubectl(
                "-n", served.namespace, "exec", pod, "-c", "rtserve", "--", "python", "-c", connect, timeout=30
            )
            if done.returncode == 0:
                break
            assert time.monotonic() - start < POLICY_OPEN_S, f"{pod} cannot reach {host}:{port}: {done.stderr[-300:]}"
            time.sleep(0.5)
    return time.monotonic() - start


def candidate_policies(cluster) -> list[dict]:
    """The NetworkPolicies a candidate brings (the local overlay's candidate/, as `make k8s-shadow`
    applies them): the stand-in needs them as a candidate does, since the cluster enforces the
    default pods' policy, which lets them reach nothing else."""
    text = cluster.ok("kustomize", str(REPO / "deploy" / "k8s" / "overlays" / "local" / "candidate"))
    policies = [o for o in yaml.safe_load_all(text) if o and o["kind"] == "NetworkPolicy"]
    assert {p["metadata"]["name"] for p in policies} == {"rtserve-candidate", "rtserve-to-candidate"}, policies
    return policies


def unshadow(pods: LivePods, manifest: Path) -> None:
    """Publish the default pods' routes without a shadow."""
    routes = Routes(MODEL_NAME, str(POD_RUN.live_log), token_file=POD_TOKEN_FILE, revision=int(time.time() * 1000))
    pods.publish(json.dumps(routes.json(), indent=2) + "\n", manifest)


def test_a_candidate_500ms_slower_does_not_move_the_callers_p99(held, tmp_path):
    """The default pods mirror 100 % of steady traffic to a stand-in, the routes switched in
    alternating windows through the cluster's own publishing (rtserve.promotion.live.kubectl: the ConfigMap
    and each pod, as `make k8s-shadow` does; the stand-in is no candidate Deployment that
    target could deploy) between its path that answers at once and the one that answers after
    500 ms; the callers' p99 stays within 5 ms (or the machine's own noise), and every mirror
    to the slow path was answered after 500 ms.

    The control is the same mirroring to a candidate that answers at once, not no shadow: on
    this one node the stand-in and the agent's copies take the cores the callers' pods use (a
    cost a candidate on other nodes would not add, and one that moves a p99 by more than 5 ms
    when the other tiers saturate the node). Whether the candidate's slowness reaches the
    callers is what this test asks; what mirroring costs without that CPU,
    tests/integration/test_live_routes.py asserts against no shadow."""
    served, cluster = held, held.cluster
    pods = LivePods(
        Kubectl(f"{cluster.bin_dir / 'kubectl'} --kubeconfig {cluster.kubeconfig}", out=lambda _: None), NAMESPACE
    )
    url = f"http://{SLOW}.{NAMESPACE}.svc:8080/predictions/{MODEL_NAME}/"
    manifest = tmp_path / "live-routes-configmap.json"

    def switch(slow: bool) -> None:
        version = "slow" if slow else "fast"
        routes = Routes(
            MODEL_NAME,
            str(POD_RUN.live_log),
            shadow=Route(version, 100.0, url + version),
            token_file=POD_TOKEN_FILE,
            revision=int(time.time() * 1000),
        )
        pods.publish(json.dumps(routes.json(), indent=2) + "\n", manifest)

    policies = candidate_policies(cluster)
    cluster.ok(
        "apply", "-f", "-", stdin=json.dumps({**slow_stand_in(), "items": [*slow_stand_in()["items"], *policies]})
    )
    load = SteadyLoad(
        served.url,
        {"features": [0.25] * 32},
        lambda: served.token,
        rate=SLOW_RATE,
        concurrency=SLOW_CONNECTIONS,
        max_seconds=600,
        resend_worker_lost=False,
    )
    copy = LogCopy(tmp_path / "live-log.jsonl", tmp_path / "audit.log", from_end=True)
    try:
        cluster.ok("-n", NAMESPACE, "wait", "--for=condition=Ready", f"pod/{SLOW}", "--timeout=120s", timeout=130)
        # Ready is the kubelet's word: kube-proxy routes the Service to the new pod, and the policy
        # controller admits the default pods' calls to it, once each has written its rules (until
        # then a call is rejected: a CI run's first mirrors met java.net.ConnectException)
        opened = open_from_each(served, f"{SLOW}.{NAMESPACE}.svc", 8080)
        copy.pull(pods)  # from here on (the pods' live logs hold earlier tests' lines)
        load.start("warm-up")
        switch(True)  # the agent's first mirrors open its connections: a one-off, not compared
        load.mark("warm-up on")
        time.sleep(3)
        switch(False)  # and both paths' code is compiled before either is measured
        load.mark("warm-up fast")
        time.sleep(2)
        results = shadow_cost(
            load,
            switch,
            0.3,
            WINDOWS,
            WINDOW_S,
            ATTEMPTS,
            f"{SLOW_RATE:g} req/s over {SLOW_CONNECTIONS} connections through the Service",
            max_allowed_ms=MAX_ALLOWED_MS,
            conditions=("shadow to the stand-in answering at once", "shadow to it answering after 500 ms"),
        )
        fast, slow, allowed = results[-1]
        load.mark("end")
        records = load.stop()
        assert {(r.status, r.version) for r in records} == {(200, "1.0")}, {(r.status, r.version) for r in records}
        assert slow.p99_ms - fast.p99_ms <= allowed <= MAX_ALLOWED_MS, [(f.p99_ms, s.p99_ms, a) for f, s, a in results]
        unshadow(pods, manifest)
        time.sleep(1)  # the last mirrors answered and logged (the agent flushes every 200 ms)
        copy.pull(pods)
        lines = [line for line in map(json.loads, copy.live_log.read_text().splitlines()) if line["kind"] == "shadow"]
        mirrors = {v: [line for line in lines if line["version"] == v] for v in ("fast", "slow")}
        slow_sent = sum(1 for r in records if r.phase.startswith("on ") or r.phase == "warm-up on")
        print(
            f"the stand-in reached from every default pod {opened:.1f} s after it was Ready; "
            f"{len(mirrors['slow'])} mirrors to the slow path for {slow_sent} requests sent while it was "
            f"the shadow, its answers in {min(m['ms'] for m in mirrors['slow']):.0f} to "
            f"{max(m['ms'] for m in mirrors['slow']):.0f} ms; {len(mirrors['fast'])} to the fast path, "
            f"in {min(m['ms'] for m in mirrors['fast']):.0f} to {max(m['ms'] for m in mirrors['fast']):.0f} ms"
        )
        assert {m["status"] for m in lines} == {200}, {m.get("error") for m in lines}
        assert min(m["ms"] for m in mirrors["slow"]) >= 500
        assert len(mirrors["slow"]) >= slow_sent, (len(mirrors["slow"]), slow_sent)
        assert mirrors["fast"] and sorted(m["ms"] for m in mirrors["fast"])[len(mirrors["fast"]) // 2] < 500
    finally:
        load.stop()
        unshadow(pods, manifest)
        cluster.kubectl("-n", NAMESPACE, "delete", "pod,service", SLOW, "--ignore-not-found", "--wait=false")
        for policy in policies:
            cluster.kubectl(
                "-n", NAMESPACE, "delete", "networkpolicy", policy["metadata"]["name"], "--ignore-not-found"
            )


def test_shadow_canary_abort_then_a_promotion_rolled_out_and_back_under_traffic(held, image_vars, mar_v1, tmp_path):
    """2.0 shadowed at 100 % under steady traffic of the held-out rows (its agreement with 1.0
    recomputed here from the in-process models: the evidence its promotion rests on), a sticky
    10 % canary, its abort when the candidate goes, then the promotion with that evidence rolled
    out and back, every phase's last answers from the version it rolled to."""
    from rtserve.model.data import make_dataset

    served, cluster = held, held.cluster
    rows = make_dataset().x_test[:HELD_OUT].tolist()
    state = tmp_path / "live"
    live = live_vars(served, image_vars, state)
    timings: dict[str, float] = {}
    try:
        # -- shadow 100 % under steady traffic: callers see 1.0 only ------------------------------------
        load = served.load(rows=rows)
        begin = time.monotonic()
        shadow = make("k8s-shadow", "MODEL_VERSION=2.0", *live, timeout=DEPLOY_TIMEOUT)
        timings["k8s-shadow (image load, candidate rollout)"] = time.monotonic() - begin
        assert shadow.returncode == 0, shadow.stdout[-4000:]
        assert 'deployment "rtserve-candidate" successfully rolled out' in shadow.stdout, shadow.stdout[-3000:]
        published = load.now()
        print(">> make k8s-shadow:\n" + "\n".join(shadow.stdout.splitlines()[-8:]))
        time.sleep(20)
        records = load.stop()
        no_failures(records, "shadow 100%")
        assert {r.version for r in records} == {"1.0"}
        routes = pod_routes(served)
        assert {r["shadow"]["percent"] for r in routes.values()} == {100.0}, routes
        assert {r["shadow"]["url"] for r in routes.values()} == {
            f"http://rtserve-candidate.{NAMESPACE}.svc:8080/predictions/realtime-classifier/2.0"
        }
        report = make("k8s-shadow-report", *live, timeout=120)
        assert report.returncode == 0, report.stdout[-3000:]
        print(report.stdout[-2500:])
        saved = json.loads((state / "shadow-report.json").read_text())
        after = [r for r in records if r.start > published + 1.0]  # the agent read the routes by then
        assert saved["candidate"] == "2.0" and saved["default"] == ["1.0"], saved
        assert len(after) <= saved["mirrored"] <= len(records), (len(after), saved["mirrored"], len(records))
        assert saved["compared"] == saved["mirrored"] - saved["dropped"] - saved["unmatched"]
        assert saved["compared"] >= 0.9 * len(after) and saved["agreement"] is not None
        assert saved["errors"]["candidate"]["errors"] == 0, saved["errors"]
        # the agreement is the in-process models' on the rows of the mirrored requests
        sent = {r.request_id: rows[r.payload] for r in records if r.request_id}
        log = [json.loads(line) for line in (state / "report" / "live-log.jsonl").read_text().splitlines()]
        paired = [
            sent[line["of"]]
            for line in log
            if line["kind"] == "shadow" and line["version"] == "2.0" and line["status"] == 200 and line["of"] in sent
        ]
        same, ties = agreement(
            *(Reference.from_mar(mar_v1.parent / f"{MODEL_NAME}_{v}.mar", demo_eager(v)) for v in ("1.0", "2.0")),
            paired,
        )
        print(
            f"shadow 2.0: agreement {saved['agreement']:.4f} over {saved['compared']} compared of "
            f"{len({tuple(r) for r in paired})} held-out rows; recomputed {same}/{len(paired)} ({ties} near-ties)"
        )
        assert saved["compared"] <= len(paired) <= saved["compared"] + saved["unmatched"], (len(paired), saved)
        assert abs(saved["agreement"] * saved["compared"] - same) <= ties + len(paired) - saved["compared"] + 1e-3
        assert 0.9 <= saved["agreement"] < 1.0, saved  # the rows tell the versions apart; the gate's floor

        # -- canary 10 %: sticky per key, the share within 2 points over 2,000 keys (4,000 requests) -------
        gate = gate_config(tmp_path)
        canary = make(
            "k8s-canary",
            "MODEL_VERSION=2.0",
            f"PERCENT={PERCENT:g}",
            f"GATE_CONFIG={gate}",
            *live,
            timeout=DEPLOY_TIMEOUT,
        )
        assert canary.returncode == 0, canary.stdout[-3000:]
        print(">> make k8s-canary:\n" + "\n".join(canary.stdout.splitlines()[-6:]))
        begin = time.monotonic()
        answers = keyed(served, KEYS + KEYS)
        timings["4,000 keyed requests"] = time.monotonic() - begin
        assert {a["status"] for a in answers} == {200}, [a for a in answers if a["status"] != 200][:5]
        seen: dict[str, set[str]] = {k: set() for k in KEYS}
        for a in answers:
            seen[a["key"]].add(a["version"])
        assert all(len(v) == 1 for v in seen.values()), {k: v for k, v in seen.items() if len(v) > 1}
        expected = {k for k in KEYS if sticky_bucket(k) < PERCENT}  # the agent's documented hash
        share = sum(a["version"] == "2.0" for a in answers) / len(answers) * 100
        print(
            f"canary share: {share:.2f}% of {len(answers)} requests (configured {PERCENT:g}%), "
            f"{len(expected)} of {len(KEYS)} keys, each key twice, always the same version"
        )
        assert {k for k, v in seen.items() if v == {"2.0"}} == expected
        assert abs(share - PERCENT) <= 2.0

        # -- the candidate goes away: the watcher aborts, the share is back to 0 -----------------------
        cluster.ok("-n", NAMESPACE, "scale", "deployment/rtserve-candidate", "--replicas=0")
        scaled = time.time()
        history = state / "rollout-history.jsonl"
        rounds: list[dict] = []
        aborted_at, deadline = None, time.monotonic() + ABORT_WAIT_S
        while aborted_at is None or rounds[-1]["at"] < aborted_at + 3:  # 3 s past the abort
            assert time.monotonic() < deadline, (state / "canary-watcher.log").read_text()[-3000:]
            rounds += keyed(served, [f"abort-{uuid.uuid4().hex[:8]}" for _ in range(100)])
            events = [json.loads(line) for line in history.read_text().splitlines()] if history.exists() else []
            aborts = [e for e in events if e["action"] == "canary-abort"]
            if aborted_at is None and aborts:
                aborted_at = time.time()
                event = aborts[0]
                event_at = datetime.fromisoformat(event["at"]).timestamp()
        timings["scale to 0 -> abort seen"] = aborted_at - scaled
        print((state / "canary-watcher.log").read_text()[-1500:])
        assert event["version"] == "2.0" and event["percent"] == PERCENT
        assert event["failures"][0].startswith("error rate:"), event
        failed = [a for a in rounds if a["status"] != 200]
        # no failed request but the candidate's own answers, and those only to its keys
        assert all(sticky_bucket(a["key"]) < PERCENT and a["at"] < aborted_at for a in failed), failed[:5]
        late = [a for a in rounds if a["at"] > aborted_at + 1]
        assert late and {(a["status"], a["version"]) for a in late} == {(200, "1.0")}
        assert {r["canary"]["percent"] for r in pod_routes(served).values()} == {0.0}
        configmap = json.loads(
            cluster.ok(
                "-n", NAMESPACE, "get", "configmap", "rtserve-live-routes", "-o", "jsonpath={.data.routes\\.json}"
            )
        )
        assert configmap["canary"]["percent"] == 0.0
        assert not (state / "canary-watcher.pid").exists()  # the watcher ended with its abort
        # and wrote the event into the audit log of each default pod running at the abort (one
        # started later has none: it starts with the ConfigMap's routes, share 0)
        deadline = time.monotonic() + 20
        while not (
            named := re.search(
                r"^abort recorded in the audit log of (.+)$", log := (state / "canary-watcher.log").read_text(), re.M
            )
        ):
            assert time.monotonic() < deadline, log[-2000:]
            time.sleep(0.5)
        written = named[1].split(", ")
        older = {
            p.name
            for p in served.deployed.pods()
            if datetime.fromisoformat(p.created.replace("Z", "+00:00")).timestamp() < event_at - 60
        }
        assert older <= set(written), (older, written)
        for pod in written:
            tail = served.deployed.exec(pod, "rtserve", "tail", "-n", "5000", "/home/model-server/run/logs/audit.log")
            assert '"event":"canary-abort"' in tail, pod
        print(
            f"abort: {len(rounds)} requests after the scale to 0, {len(failed)} failed "
            f"({sorted({a['status'] for a in failed})}), {len(late)} after the abort, all 1.0"
        )
    finally:
        begin = time.monotonic()
        stopped = make("k8s-live-stop", *live, timeout=300)
        timings["k8s-live-stop"] = time.monotonic() - begin
        print(">> make k8s-live-stop:\n" + "\n".join(stopped.stdout.splitlines()[-8:]))
        print("; ".join(f"{k}: {v:.0f} s" for k, v in timings.items()))
    assert stopped.returncode == 0, stopped.stdout[-3000:]
    assert (
        cluster.ok(
            "-n", NAMESPACE, "get", "deployment,service", "-l", "app.kubernetes.io/component=candidate", "-o", "name"
        )
        == ""
    )
    assert {json.dumps([r["shadow"], r["canary"]]) for r in pod_routes(served).values()} == {"[null, null]"}

    # -- promotion with live.promote.require_shadow: the 2.0 shadow's evidence (the default pods'
    # logs still hold it) is accepted, 2.0 rolled out under steady traffic, then rolled back ----
    evidence = [
        *cluster.make_vars,
        *image_vars,
        f"K8S_LIVE_DIR={state}",
        f"GATE_CONFIG={evidence_config(tmp_path, EVIDENCE_REQUESTS)}",
    ]
    records, outputs = pod_rollout.run(served.deployed, pod_rollout.steps("2.0", evidence), rate=RATE, concurrency=4)
    accepted = outputs["2.0 rollout"][0]
    print(
        ">> make k8s-deploy 2.0 (live evidence accepted):\n"
        + "\n".join(line for line in accepted.splitlines() if "live evidence" in line or line.startswith(">>"))
    )
    assert re.search(r"live evidence: \d+ mirrored requests, agreement (1\.0000|0\.9\d+)", accepted), accepted[-3000:]
    assert "registry.example.com/ml/rtserve:2.0 verified on local" in accepted, accepted[-3000:]
    # The Job ran again for this version (a Job's pod template is immutable: deleted, made anew).
    assert 'job.batch "rtserve-verify" deleted' in accepted, accepted[-3000:]
    events = evidence_events(state)
    assert [e["outcome"] for e in events] == ["deployed"] and events[0]["live"]["requests"] >= EVIDENCE_REQUESTS
    for phase, version in (("2.0 rollout", "2.0"), ("k8s-rollback", "1.0")):
        no_failures([r for r in records if r.phase.startswith(phase)], phase)
        assert not pod_rollout.settled(records, phase, version)  # every caller on it once the phase ended
    report = pod_rollout.report(records)
    print({k: f"{v['sent']} requests, {v['failed_first']} failed" for k, v in report.items()})
    # Callers' answers switched to 2.0 during the rollout, and back to 1.0 during the rollback.
    assert set(report["2.0 rollout"]["versions"]) == {"1.0", "2.0"}, report["2.0 rollout"]
    assert set(report["k8s-rollback"]["versions"]) == {"1.0", "2.0"}, report["k8s-rollback"]
    assert served.versions() == {"1.0"}  # rolled back
    history = make("k8s-history", "OVERLAY=local", *cluster.make_vars)
    assert history.returncode == 0, history.stdout
    assert re.search(
        r"realtime-classifier 1\.0 \(registry\.example\.com/ml/rtserve:1\.0\) by make k8s-deploy", history.stdout
    ), history.stdout
    assert "realtime-classifier 2.0 (registry.example.com/ml/rtserve:2.0) by make k8s-deploy" in history.stdout


def evidence_config(tmp_path: Path, min_requests: int) -> Path:
    """config/gate.yaml requiring the shadow's evidence for a promotion: ``min_requests``
    mirrored requests both versions answered, agreement at least 0.9."""
    config = yaml.safe_load((REPO / "config" / "gate.yaml").read_text())
    config["live"]["promote"]["require_shadow"] = True
    config["live"]["shadow"].update(min_requests=min_requests, min_agreement=0.9)
    path = tmp_path / f"gate-live-{min_requests}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def evidence_events(state: Path) -> list[dict]:
    history = state / "rollout-history.jsonl"
    return [e for e in map(json.loads, history.read_text().splitlines()) if e["action"] == "k8s-promote"]
