"""Every answered request's record reaches Apache Cassandra exactly once, whatever fails.

A real TorchServe (started as ``make serve`` starts it) ships its records to the tier's real
Cassandra while a steady load (a tenth of it bad requests, answered 400) runs through each
fault: the shipper killed with SIGKILL and started again; a worker killed with SIGKILL
mid-batch; the whole server killed with SIGKILL and started again from the same run directory;
the store stopped for a minute and started again; the server stopped gracefully. Then every
request id a client saw answered (200 or 400) is looked up in the store: each is there exactly
once (one row by id, one row in its hour), with the version that answered it. A request whose
answer never came (the killed worker's batch) may have a record or not; it is only counted.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import psutil
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from bench.loadgen import SteadyLoad
from rtserve.errors import StoreUnavailable
from rtserve.records.store import Store
from rtserve.server.torchserve import SHIPPER
from tests.conftest import MODEL_NAME
from tests.helpers import features, make

pytestmark = pytest.mark.records

#: Requests a second, over 4 connections: steady, with room for the machine's other tiers.
RATE = 120.0
#: Seconds every answered record has to reach the store once the load has stopped. 120 s was
#: too short once, at a load of 20 on 2 cores: 197 of 12,284 records of the store-away fault were
#: still in the spool (not lost: the shipper's checkpoint later covered every segment).
SHIP_TIMEOUT = 240.0
#: How long the store stays away in its fault (the issue's "a minute").
STORE_AWAY_S = 60.0
#: The store-away fault's rate: a minute's spool at RATE is more than a busy machine's store
#: takes back within SHIP_TIMEOUT beside the other tiers.
STORE_AWAY_RATE = 40.0
#: Answered requests whose record is also looked up by id (a look each).
SAMPLE_BY_ID = 200


@pytest.fixture(scope="module")
def store(cassandra):
    with Store.connect([cassandra.address]) as found:
        yield found


def load(server, seconds: float, rate: float = RATE) -> SteadyLoad:
    """Steady predictions at ``rate``, one request in ten a bad one (400), for at most
    ``seconds`` (stopped earlier by the test)."""
    url = f"{server.props['inference_address']}/predictions/{MODEL_NAME}"
    return SteadyLoad(
        url,
        {"features": features()},
        lambda: server.client().keys.get("inference"),
        rate=rate,
        concurrency=4,
        max_seconds=seconds,
        timeout=10.0,
        resend_worker_lost=False,
        bad_every=10,
        bad_payload={"features": [1.0, 2.0]},
    )


def check_stored(store: Store, load_records, since: datetime) -> dict:
    """Wait until every answered request's record is in the store, then check each is there
    once, with its version and status. Returns the counts (printed by the test).

    Each look reads the model's time-ordered table from ``since`` once (a look per id costs the
    busy store a round trip each: 20,000 of them took longer than the shipping); a sample of the
    ids is then looked up by id, and must agree."""
    answered = {r.request_id: r for r in load_records if r.answered}
    assert answered, "the load got no answer at all"
    assert "" not in answered and None not in answered
    deadline = time.monotonic() + SHIP_TIMEOUT
    while True:
        by_time = Counter()
        found: dict[str, object] = {}
        try:
            for rec in store.records(MODEL_NAME, since - timedelta(minutes=1)):
                by_time[rec.request_id] += 1
                found[rec.request_id] = rec
        except StoreUnavailable:  # this session's driver not yet back to a restarted node
            if time.monotonic() > deadline:
                raise
            time.sleep(2.0)
            continue
        missing = answered.keys() - found.keys()
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(2.0)
    assert not missing, (
        f"{len(missing)} of {len(answered)} answered requests have no record "
        f"after {SHIP_TIMEOUT:.0f} s, e.g. {sorted(missing)[:3]}"
    )
    for rid, sent in answered.items():
        assert found[rid].status == sent.status, (sent, found[rid].line)
        assert found[rid].model_version == (sent.version or "1.0"), (sent, found[rid].line)
    # one row per request in the time-ordered table (a record shipped twice with another time
    # would show there), and the table by id agrees on a sample
    twice = {rid: n for rid, n in by_time.items() if rid in answered and n != 1}
    assert not twice, f"records stored more than once: {list(twice.items())[:3]}"
    for rid in sorted(answered)[:: max(1, len(answered) // SAMPLE_BY_ID)]:
        by_id = store.find(rid)
        assert by_id is not None and by_id.line == found[rid].line, (rid, by_id)
    unanswered = [r for r in load_records if not r.answered]
    return {
        "sent": len(load_records),
        "answered": len(answered),
        "answered_400": sum(1 for r in answered.values() if r.status == 400),
        "found_once": len(answered),
        "not_answered": len(unanswered),
        "not_answered_with_record": sum(1 for r in unanswered if r.request_id and r.request_id in found),
    }


def run_fault(server, store, fault, name: str, seconds: float = 12.0, rate: float = RATE) -> dict:
    """Load for a while, ``fault()`` in the middle, load a while more; then the check."""
    since = datetime.now(UTC)
    steady = load(server, seconds * 10 + 600, rate).start(name)
    try:
        time.sleep(seconds / 2)
        fault()
        time.sleep(seconds / 2)
    finally:
        got = steady.stop()
    counts = check_stored(store, got, since)
    print(f"{name}: {counts}")
    return counts


def test_the_records_metrics_show_the_shipping(server, store):
    """What the dashboard's records panels read: records written and shipped, the ship lag."""
    run_fault(server, store, lambda: None, "no fault", seconds=4.0)
    text = requests.get(f"{server.props['metrics_address']}/metrics", timeout=10).text
    found = {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("rtserve_records_")
    }
    print({k: v for k, v in found.items() if not k.endswith("_bucket")})
    assert found["rtserve_records_shipped_total"] > 0 and found["rtserve_records_ship_lag_seconds_count"] > 0
    assert found["rtserve_records_ship_lag_seconds_count"] == found["rtserve_records_shipped_total"]
    assert found["rtserve_records_dropped_total"] == 0 and found["rtserve_records_store_up"] == 1


def test_the_shipper_killed_and_started_again_loses_and_repeats_nothing(server, store):
    killed = []

    def fault() -> None:
        pid = server.sidecar_pid(SHIPPER)
        assert pid is not None, "the shipper does not run"
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)
        time.sleep(3.0)  # records pile up in the spool meanwhile
        server.start_sidecar(SHIPPER)

    counts = run_fault(server, store, fault, "shipper SIGKILL")
    assert killed and server.sidecar_pid(SHIPPER) not in (None, killed[0])
    assert counts["not_answered"] == 0


def worker_pids(server) -> list[int]:
    """The model's worker processes (children of the frontend running TorchServe's worker)."""
    frontend = psutil.Process(server.pid())
    return [
        p.pid for p in frontend.children(recursive=True) if any("model_service_worker" in part for part in p.cmdline())
    ]


def test_a_worker_killed_mid_batch_leaves_every_answered_request_its_record(server, store):
    killed = []

    def fault() -> None:
        pids = worker_pids(server)
        assert pids, "no worker found"
        os.kill(pids[0], signal.SIGKILL)
        killed.append(pids[0])

    run_fault(server, store, fault, "worker SIGKILL")
    assert killed
    deadline = time.monotonic() + 60
    while len(worker_pids(server)) < 2 and time.monotonic() < deadline:  # TorchServe restarts it
        time.sleep(0.5)


def test_the_whole_server_killed_and_started_again_ships_what_it_left(server, store):
    def fault() -> None:
        procs = [psutil.Process(server.pid())]
        procs += procs[0].children(recursive=True)
        procs += [psutil.Process(pid) for sidecar in (SHIPPER,) if (pid := server.sidecar_pid(sidecar)) is not None]
        for proc in procs:
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=10)
        left = list(server.files.records.glob("*.jsonl"))
        assert left, "the killed server left no spool"
        server.start()  # the same run directory: its spool and the shipper's checkpoint
        server.wait_ready(180, [MODEL_NAME])

    counts = run_fault(server, store, fault, "server SIGKILL, started again", seconds=16.0)
    print(f"server SIGKILL: {counts['not_answered']} requests got no answer while it was down")


def test_the_store_away_for_a_minute_keeps_the_records_in_the_spool_then_drains(server, store, cassandra):
    def fault() -> None:
        stopped = make("cassandra-stop", *cassandra.make_vars)
        assert stopped.returncode == 0, stopped.stdout
        time.sleep(STORE_AWAY_S)
        started = make("cassandra", *cassandra.make_vars)
        assert started.returncode == 0, started.stdout

    counts = run_fault(server, store, fault, "store stopped for a minute", seconds=10.0, rate=STORE_AWAY_RATE)
    assert counts["answered"] > STORE_AWAY_RATE * STORE_AWAY_S * 0.5  # served throughout


def test_a_graceful_stop_ships_the_spool_before_the_server_exits(server, store):
    since = datetime.now(UTC)
    steady = load(server, 600).start("graceful stop")
    time.sleep(4.0)
    got = steady.stop()
    server.stop()  # SIGTERM: TorchServe first, then the shipper ships what is left
    try:
        answered = [r for r in got if r.answered]
        missing = [r.request_id for r in answered if store.find(r.request_id) is None]
        assert not missing, f"{len(missing)} of {len(answered)} records not shipped by the stop"
        print(f"graceful stop: {len(answered)} answered, all found at once after the stop")
    finally:
        server.start()
        server.wait_ready(180, [MODEL_NAME])
    check_stored(store, got, since)
