"""The consumer's metrics port against the real broker and a real TorchServe: ``python -m rtserve
stream run`` as its own process (what ``make stream`` starts), scraped over HTTP. While TorchServe
cannot be reached, the lag is the whole backlog, retries count up and nothing is written; a member
that reaches it drains the topic: the lag falls to 0 on every partition, and the counters and the
histogram match the events sent, as read back with read_committed."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import psutil
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from rtserve.runtime.ports import free_ports
from rtserve.runtime.process import wait_until
from rtserve.stream import service
from tests.conftest import MODEL_NAME, REPO
from tests.stream.helpers import PARTITIONS, produce, read_all, stream_topics, valid_events
from tests.stream.test_consumer import POISON

pytestmark = pytest.mark.stream

VALID = 200


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def scrape(base: str) -> dict[tuple[str, tuple], float]:
    """(sample name, sorted labels) -> value of one scrape of ``base``/metrics."""
    status, body = get(base + "/metrics")
    assert status == 200, body
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(body.decode())
        for s in f.samples
    }


def lag(samples: dict) -> dict[int, float]:
    return {
        dict(labels)["partition"]: v for (name, labels), v in samples.items() if name == "rtserve_stream_consumer_lag"
    }


def pod_memory_mib() -> float:
    """The memory limit of the stream consumer's container in deploy/k8s/components/stream."""
    deployment = yaml.safe_load((REPO / "deploy" / "k8s" / "components" / "stream" / "deployment.yaml").read_text())
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    limit = container["resources"]["limits"]["memory"]
    return float(limit[:-2]) * {"Mi": 1, "Gi": 1024}[limit[-2:]]


def test_metrics_and_health_follow_a_stalled_then_draining_consumer(kafka, torchserve, tmp_path):
    topics = stream_topics(kafka)
    sent = produce(
        kafka,
        topics["events"],
        valid_events(VALID) + [(b"poison-%d" % i, value) for i, (value, _, _) in enumerate(POISON)],
    )
    props = torchserve.props
    port = free_ports(1)[0]
    base = f"http://127.0.0.1:{port}"
    run = topics["events"].rsplit("-", 1)[1]
    common = [
        "--bootstrap",
        kafka.bootstrap,
        "--key-file",
        str(torchserve.key_file),
        "--model",
        MODEL_NAME,
        "--group",
        f"stream-{run}",
        "--input",
        topics["events"],
        "--output",
        topics["predictions"],
        "--dead-letters",
        topics["events.dlq"],
        "--batch",
        "32",
        "--metrics-port",
        str(port),
    ]
    nowhere = f"http://127.0.0.1:{free_ports(1)[0]}"
    try:
        # 1. TorchServe unreachable: ready (subscribed, producer made), the backlog is the lag.
        service.start(tmp_path, [*common, "--inference", nowhere, "--management", nowhere, "--timeout", "2"])
        assert wait_until(lambda: get(base + "/ready")[0] == 200, 60, poll=0.2), get(base + "/ready")
        status, body = get(base + "/healthz")
        assert status == 200 and json.loads(body)["ok"] is True

        def stalled():
            samples = scrape(base)
            return (
                samples[("rtserve_stream_retries_total", ())] >= 2
                and sum(lag(samples).values()) == len(sent)
                and samples
            )

        samples = wait_until(stalled, 60, poll=0.5)
        assert samples, f"no backlog lag with retries in 60 s: {scrape(base)}"
        assert set(lag(samples)) == {str(p) for p in range(PARTITIONS)}
        assert samples[("rtserve_stream_assigned_partitions", ())] == PARTITIONS
        assert samples[("rtserve_stream_events_total", (("outcome", "predicted"),))] == 0
        assert samples[("rtserve_stream_event_to_prediction_seconds_count", ())] == 0
        status, body = get(base + "/ready")
        assert status == 200 and sorted(json.loads(body)["assigned"]) == [
            f"{topics['events']}[{p}]" for p in range(PARTITIONS)
        ], body
        stopped = service.stop(tmp_path)
        assert stopped.startswith("0 predictions, 0 dead letters in 0 transactions (0 aborted, "), stopped

        # 2. TorchServe reachable: every event written once; the lag drains to 0.
        begin = time.time()
        service.start(
            tmp_path, [*common, "--inference", props["inference_address"], "--management", props["management_address"]]
        )

        def drained():
            samples = scrape(base)
            written = sum(v for (name, _), v in samples.items() if name == "rtserve_stream_events_total")
            return (
                written == len(sent) and len(lag(samples)) == PARTITIONS and not any(lag(samples).values()) and samples
            )

        samples = wait_until(drained, 120, poll=0.5)
        assert samples, f"not drained in 120 s: {scrape(base)}"
        took = time.time() - begin
        assert samples[("rtserve_stream_events_total", (("outcome", "predicted"),))] == VALID
        assert samples[("rtserve_stream_events_total", (("outcome", "dead_lettered"),))] == len(POISON)
        assert samples[("rtserve_stream_transactions_total", (("result", "aborted"),))] == 0
        assert samples[("rtserve_stream_transactions_total", (("result", "committed"),))] >= len(sent) / 32
        assert samples[("rtserve_stream_retries_total", ())] == 0
        assert samples[("rtserve_stream_producer_recreations_total", ())] == 0
        # each event counted once; none older than the time since it was sent
        count = samples[("rtserve_stream_event_to_prediction_seconds_count", ())]
        assert count == len(sent)
        buckets = {
            dict(labels)["le"]: v
            for (name, labels), v in samples.items()
            if name == "rtserve_stream_event_to_prediction_seconds_bucket"
        }
        assert buckets["+Inf"] == count and buckets["300.0"] == count
        assert 0 < samples[("rtserve_stream_event_to_prediction_seconds_sum", ())]
        assert samples[("rtserve_stream_loop_age_seconds", ())] < 10
        # each micro-batch (at most 64 events: one request) timed once in every stage; together the
        # stages of its first event take no longer than the events' own times to their commits
        stage = {
            dict(labels)["stage"]: v
            for (name, labels), v in samples.items()
            if name == "rtserve_stream_stage_seconds_count"
        }
        assert set(stage) == {"wait", "linger", "score", "order", "queue", "commit"}, stage
        assert len(set(stage.values())) == 1 and len(sent) / 64 <= stage["score"] <= len(sent), stage
        spent = {
            dict(labels)["stage"]: v
            for (name, labels), v in samples.items()
            if name == "rtserve_stream_stage_seconds_sum"
        }
        assert spent["score"] > 0 and spent["commit"] > 0, spent
        assert sum(spent.values()) <= samples[("rtserve_stream_event_to_prediction_seconds_sum", ())] + 0.1, spent
        rss = psutil.Process(service.pid(tmp_path)).memory_info().rss / 2**20
        assert rss * 1.5 <= pod_memory_mib(), f"the consumer holds {rss:.0f} MiB: raise the pod's memory"
        print(
            f"drained {len(sent)} events in {took:.1f} s (RSS {rss:.0f} MiB); event-to-prediction buckets: {buckets}; "
            f"{stage['score']:.0f} micro-batches, seconds per stage: {spent}"
        )
    finally:
        service.stop(tmp_path)
    with pytest.raises(urllib.error.URLError):  # the port went with the process
        urllib.request.urlopen(base + "/healthz", timeout=2)
    outputs = read_all(kafka.bootstrap, topics["predictions"]) + read_all(kafka.bootstrap, topics["events.dlq"])
    coordinates = sorted(
        (json.loads(m.value())["source"]["partition"], json.loads(m.value())["source"]["offset"]) for m in outputs
    )
    assert coordinates == sorted(sent), "the counters say what the topics hold"
