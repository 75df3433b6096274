"""The autoscaler on the pods' own serving signals: Prometheus (built from its module, run by `make
cluster`) scrapes the pods, prometheus-adapter serves their mean queue wait and p99 as custom
metrics, and the HorizontalPodAutoscaler of the local overlay scales on them beside CPU.

A stand-in, said so: the model is made slow per request without CPU. A ConfigMap mounted at
/opt/standin holds a ``sitecustomize`` that, in TorchServe's worker processes only, sleeps
:data:`MS_PER_REQUEST` per request of each batch before TorchServe's own ``predict`` reads it; the
Deployment gets it through ``PYTHONPATH`` (a rollout) and loses it by ``kubectl rollout undo``.
A pod then carries 2 workers x 1000 / MS_PER_REQUEST requests/s whatever its CPU, as a model bound
by a GPU or a downstream call would: a load above two pods' capacity and under three's fills the
queue while the CPU stays under its target.
"""

from __future__ import annotations

import json
import re
import time
import urllib.parse
import urllib.request
from datetime import datetime

import pytest
import yaml

from bench.loadgen import Counts, percentile
from rtserve.cluster import runtime
from tests.cluster.conftest import NAMESPACE, hpa_status, no_failures, wait_for
from tests.conftest import MODEL_NAME, REPO

pytestmark = pytest.mark.cluster

RULES = REPO / "deploy" / "monitoring" / "prometheus-adapter.yaml"
QUEUE, P99 = "rtserve_queue_seconds", "rtserve_request_p99_seconds"
#: The stand-in's sleep per request: a pod (2 workers) carries 40 requests/s.
MS_PER_REQUEST = 50
#: The load: more than two pods carry (their queues fill, bounded by the senders), 0.75 of what
#: three carry; each request on a new connection (kube-proxy picks a pod per connection, so a pod
#: the autoscaler adds gets its share at once); enough senders that slow answers do not slow them.
RATE, CONCURRENCY = 90.0, 32
STANDIN = '''"""rtserve's cluster tier stand-in (tests/cluster/test_autoscaling.py): a slow model, without CPU."""
import os
import time

with open("/proc/self/cmdline", "rb") as f:
    _worker = b"model_service_worker.py" in f.read()
_ms = float(os.environ.get("RTSERVE_STANDIN_MS_PER_REQUEST", "0"))
if _worker and _ms > 0:
    import ts.service

    _read = ts.service.Service.retrieve_data_for_inference

    def _slow(batch):
        time.sleep(_ms * len(batch) / 1000.0)
        return _read(batch)

    ts.service.Service.retrieve_data_for_inference = staticmethod(_slow)
'''


def answered_by(cluster, pod: str) -> int:
    """How many predictions ``pod``'s gateway has answered 200 (its access log: the container's output)."""
    logs = cluster.ok("-n", NAMESPACE, "logs", pod, "-c", "gateway", timeout=60)
    return len(re.findall(rf'"POST /predictions/{MODEL_NAME}\S* HTTP/1\.1" 200 ', logs))


def quantity(text: str) -> float:
    """A Kubernetes quantity as a number ("153m" -> 0.153)."""
    scale = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9}
    return float(text[:-1]) * scale[text[-1]] if text[-1] in scale else float(text)


def targets(cluster) -> dict[str, float]:
    """The HPA's target per metric: CPU in % of the requests, the serving signals in seconds."""
    spec = json.loads(cluster.ok("-n", NAMESPACE, "get", "hpa", "rtserve", "-o", "json"))["spec"]
    found = {}
    for m in spec["metrics"]:
        if m["type"] == "Resource":
            found[m["resource"]["name"]] = float(m["resource"]["target"]["averageUtilization"])
        elif m["type"] == "Pods":
            found[m["pods"]["metric"]["name"]] = quantity(m["pods"]["target"]["averageValue"])
    return found


def current(status: dict) -> dict[str, float]:
    """What the HPA last read, per metric (CPU in %, the serving signals in seconds)."""
    found = {}
    for m in status.get("currentMetrics") or []:
        if m["type"] == "Resource" and "averageUtilization" in m["resource"]["current"]:
            found[m["resource"]["name"]] = float(m["resource"]["current"]["averageUtilization"])
        elif m["type"] == "Pods":
            found[m["pods"]["metric"]["name"]] = quantity(m["pods"]["current"]["averageValue"])
    return found


def served_metric(cluster, name: str) -> dict[str, tuple[float, str]]:
    """Each pod's ``name`` as the custom metrics API serves it: (value, its timestamp)."""
    path = f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{NAMESPACE}/pods/*/{name}"
    items = json.loads(cluster.ok("get", "--raw", path))["items"]
    return {i["describedObject"]["name"]: (quantity(i["value"]), i["timestamp"]) for i in items}


def prometheus(cluster, path: str, **params: str) -> list[dict]:
    """The local cluster's Prometheus (on loopback, its port in the run directory's state)."""
    port = json.loads((cluster.run_dir / runtime.STATE_FILE).read_text())["ports"]["prometheus"]
    url = f"http://127.0.0.1:{port}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as answer:
        body = json.loads(answer.read())
    assert body["status"] == "success", body
    return body["data"]["result"]


def adapter_query(name: str, pods: list[str]) -> str:
    """The PromQL prometheus-adapter runs for metric ``name`` of ``pods`` (its rules file's template)."""
    (rule,) = [r for r in yaml.safe_load(RULES.read_text())["rules"] if r["name"]["as"] == name]
    matchers = f'namespace="{NAMESPACE}",pod=~"{"|".join(pods)}"'
    return rule["metricsQuery"].replace("<<.LabelMatchers>>", matchers).replace("<<.GroupBy>>", "pod")


@pytest.fixture
def slow_model(served):
    """The Deployment running the stand-in (see the module's docstring), undone afterwards; the HPA
    at its minimum of 2 both times."""
    cluster = served.cluster
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "rtserve-standin", "namespace": NAMESPACE},
        "data": {"sitecustomize.py": STANDIN},
    }
    cluster.ok("apply", "-f", "-", stdin=json.dumps(configmap))
    template = json.loads(cluster.ok("-n", NAMESPACE, "get", "deployment", "rtserve", "-o", "json"))["spec"]["template"]
    (index,) = [i for i, c in enumerate(template["spec"]["containers"]) if c["name"] == "rtserve"]
    container = f"/spec/template/spec/containers/{index}"
    patch = [
        {
            "op": "add",
            "path": "/spec/template/spec/volumes/-",
            "value": {"name": "standin", "configMap": {"name": "rtserve-standin"}},
        },
        {
            "op": "add",
            "path": f"{container}/volumeMounts/-",
            "value": {"name": "standin", "mountPath": "/opt/standin", "readOnly": True},
        },
        # The image's PYTHONPATH (/opt/rtserve) after ours: TorchServe passes it on to its workers.
        {
            "op": "add",
            "path": f"{container}/env/-",
            "value": {"name": "PYTHONPATH", "value": "/opt/standin:/opt/rtserve"},
        },
        {
            "op": "add",
            "path": f"{container}/env/-",
            "value": {"name": "RTSERVE_STANDIN_MS_PER_REQUEST", "value": str(MS_PER_REQUEST)},
        },
    ]
    begin = time.monotonic()
    cluster.ok("-n", NAMESPACE, "patch", "deployment", "rtserve", "--type=json", "-p", json.dumps(patch))
    try:
        cluster.ok("-n", NAMESPACE, "rollout", "status", "deployment/rtserve", "--timeout=600s", timeout=620)
        print(f"stand-in rolled out: {time.monotonic() - begin:.0f} s")
        yield served
    finally:
        wait_for("the HPA back at 2", lambda: hpa_status(cluster).get("desiredReplicas") == 2, timeout=300)
        cluster.ok("-n", NAMESPACE, "rollout", "undo", "deployment/rtserve")
        cluster.ok("-n", NAMESPACE, "rollout", "status", "deployment/rtserve", "--timeout=600s", timeout=620)
        cluster.ok("-n", NAMESPACE, "delete", "configmap", "rtserve-standin")


def test_queue_time_scales_out_with_cpu_under_its_target_and_p99_comes_back(slow_model):
    """At idle: the minimum of 2, every metric under its target. Under a load two pods cannot
    carry: the queue wait crosses its target while CPU stays under its own, the HPA adds the third
    pod, which turns Ready and takes its share, and the p99 it reads comes back under its target.
    The HPA's reading agrees with Prometheus's over the same window, and the adapter's with
    Prometheus's over the 30 s before the adapter's timestamp. Afterwards: back to 2, with no
    request failed on its first try throughout (the drain and the PDB hold)."""
    served = slow_model
    cluster = served.cluster
    goal = targets(cluster)
    assert set(goal) == {"cpu", QUEUE, P99}, goal
    idle = wait_for(
        "the HPA at 2 with every metric read and under its target",
        lambda: (
            (s := hpa_status(cluster)).get("desiredReplicas") == 2
            and set(now := current(s)) == set(goal)
            and all(now[k] < goal[k] for k in goal)
            and s
        ),
        timeout=240,
    )
    # metrics-server reads the pods' CPU (the HPA's third signal, and `kubectl top`).
    top = cluster.ok("-n", NAMESPACE, "top", "pods", "--no-headers")
    assert re.search(r"^rtserve-\S+ +\d+m +\d+Mi\s*$", top, re.M), top
    first = {p.name for p in served.deployed.pods()}
    load = served.load(900, rate=RATE, concurrency=CONCURRENCY, keep_alive=False, phase="slow")
    timeline: dict[str, float] = {}
    readings: dict[str, dict[str, float]] = {}
    try:

        def read(name: str, condition) -> dict | None:
            status = hpa_status(cluster)
            now = current(status)
            if condition(status, now):
                timeline.setdefault(name, load.now())
                readings.setdefault(name, {**now, "desired": float(status["desiredReplicas"])})
                return status
            return None

        wait_for(
            "the queue wait over its target",
            lambda: read("queue over", lambda s, n: n.get(QUEUE, 0) > goal[QUEUE]),
            240,
            1,
        )
        wait_for("a scale-out", lambda: read("decision", lambda s, n: s["desiredReplicas"] >= 3), 240, 1)
        added = wait_for(
            "a third pod Ready",
            lambda: [p.name for p in served.deployed.pods() if p.ready and p.name not in first],
            timeout=360,
            poll=1.0,
        )
        timeline["third pod Ready"] = load.now()
        (third,) = added
        took = wait_for("the third pod answering", lambda: answered_by(cluster, third), timeout=120, poll=2)
        timeline["third pod answers"] = load.now()
        back = wait_for(
            "the p99 back under its target",
            lambda: read(
                "p99 back",
                lambda s, n: (
                    s["currentReplicas"] >= 3 and n.get(P99, 1e9) < goal[P99] and n.get(QUEUE, 1e9) < goal[QUEUE]
                ),
            ),
            300,
            2,
        )
        # What the HPA read against Prometheus: over the 20 s before (the HPA reads every 15 s).
        pods = [p.name for p in served.deployed.pods() if p.ready]
        end = time.time()
        compared = {}
        for name in (QUEUE, P99):
            series = prometheus(
                cluster,
                "/api/v1/query_range",
                query=f"avg({adapter_query(name, pods)})",
                start=str(end - 20),
                end=str(end),
                step="1",
            )
            values = [float(v) for _, v in series[0]["values"]]
            compared[name] = (current(hpa_status(cluster))[name], min(values), max(values))
        # The adapter's own values against Prometheus over the 30 s before the adapter's timestamp,
        # as the HPA's reading above: at that one instant (a second's), a new pod whose rate
        # window was still filling read 10 % apart once (0.026 against 0.0286).
        served_now = served_metric(cluster, QUEUE)
        stamp = datetime.fromisoformat(next(iter(served_now.values()))[1].replace("Z", "+00:00")).timestamp()
        around = prometheus(
            cluster,
            "/api/v1/query_range",
            query=adapter_query(QUEUE, sorted(served_now)),
            start=str(stamp - 30),
            end=str(stamp + 1),
            step="1",
        )
        by_pod = {
            r["metric"]["pod"]: (min(float(v) for _, v in r["values"]), max(float(v) for _, v in r["values"]))
            for r in around
        }
    finally:
        records = load.stop()
    recent = [r.latency for r in records if r.start > timeline["p99 back"] - 30 and r.status == 200]
    before = [r.latency for r in records if timeline["queue over"] - 30 < r.start < timeline["decision"]]
    print(
        f"idle: {current(idle)} (targets {goal}); load {RATE:.0f} requests/s, {MS_PER_REQUEST} ms of "
        f"stand-in sleep per request; timeline (s from the load's start): "
        + ", ".join(f"{k} {v:.0f}" for k, v in timeline.items())
        + f"; readings: {readings}; client p99 before the decision {percentile(before, 0.99) * 1000:.0f} ms, "
        f"in the 30 s before the HPA's p99 was back {percentile(recent, 0.99) * 1000:.0f} ms; "
        f"HPA vs Prometheus (HPA, min, max over 20 s): {compared}; adapter vs Prometheus: "
        f"{ {p: (v, by_pod.get(p)) for p, (v, _) in served_now.items()} }; {Counts.of(records).text()}"
    )
    assert back and took > 0
    assert readings["decision"]["cpu"] < goal["cpu"], f"CPU was over its target at the decision: {readings}"
    for name, (hpa, low, high) in compared.items():
        assert low * 0.9 - 1e-3 <= hpa <= high * 1.1 + 1e-3, f"{name}: the HPA read {hpa}, Prometheus {low}..{high}"
    for pod, (value, _) in served_now.items():
        low, high = by_pod[pod]
        assert low * 0.9 - 1e-3 <= value <= high * 1.1 + 1e-3, f"{pod}: adapter {value}, Prometheus {low}..{high}"
    no_failures(records, "the queue-time scale-out")
    # Scale-in under light traffic: the drain and the PDB hold.
    light = served.load(600, rate=4, concurrency=2, keep_alive=False, phase="scale-in")
    try:
        wait_for("the scale-in", lambda: hpa_status(cluster)["desiredReplicas"] == 2, timeout=300)
        timeline["scale-in decided"] = load.now()
        wait_for("2 pods alone", lambda: len(served.deployed.pods()) == 2 and not served.deployed.terminating(), 300)
        timeline["2 pods alone"] = load.now()
    finally:
        quiet = light.stop()
    print(
        f"scale-in: {Counts.of(quiet).text()}; at {timeline['scale-in decided']:.0f} s, 2 pods alone at "
        f"{timeline['2 pods alone']:.0f} s"
    )
    no_failures(quiet, "the scale-in")
