"""rtserve.server.drain's log reading, on lines in the exact format TorchServe 0.12.0 writes them."""

from __future__ import annotations

import pytest

from rtserve.runtime.logs import LogFollower
from rtserve.server.drain import Activity

pytestmark = pytest.mark.unit

# ts_log.log: every line is written twice (TorchServe's org.pytorch.serve logger and the root
# logger both use the ts_log appender).
START = (
    "2026-11-29T15:47:36,078 [INFO ] W-{w}-realtime-classifier_1.0 "
    "org.pytorch.serve.wlm.WorkerThread - Looping backend response at: 1795967256078\n"
)
DONE = (
    "2026-11-29T15:47:36,082 [INFO ] W-{w}-realtime-classifier_1.0 "
    "org.pytorch.serve.wlm.WorkerThread - Backend response time: 4\n"
)
ACCESS = (
    "2026-11-29T15:47:36,082 [INFO ] W-{w}-realtime-classifier_1.0 ACCESS_LOG - "
    '/127.0.0.1:52564 "POST /predictions/realtime-classifier HTTP/1.1" 200 5\n'
)
ARRIVAL = (
    "2026-11-29T15:47:36,590 - ts_inference_requests_total.Count:1.0|#model_name:"
    "realtime-classifier,model_version:default|#hostname:vm,timestamp:1795967256\n"
)
LATENCY = (
    "2026-11-29T15:47:36,611 - ts_inference_latency_microseconds.Microseconds:5224.072|"
    "#model_name:realtime-classifier,model_version:default|#hostname:vm,timestamp:1795967256\n"
)


def append(path, text: str) -> None:
    with open(path, "a") as out:
        out.write(text)


@pytest.fixture()
def logs(tmp_path):
    (tmp_path / "ts_log.log").write_text(START.format(w=9000) * 2)  # busy before the drain began
    (tmp_path / "ts_metrics.log").write_text(ARRIVAL * 3)  # arrivals before the drain: not counted
    return tmp_path


def test_worker_state_follows_batch_start_and_answer(logs):
    activity = Activity(logs)
    assert activity.poll() == 0
    assert activity.busy_workers({"9000", "9001"}) == 1  # learnt from the tail read at the start
    append(logs / "ts_log.log", START.format(w=9001) * 2 + DONE.format(w=9000) * 2 + ACCESS.format(w=9000))
    activity.poll()
    assert activity.busy == {"9000": False, "9001": True}
    append(logs / "ts_log.log", DONE.format(w=9001) * 2)
    activity.poll()
    assert activity.busy_workers({"9000", "9001"}) == 0


def test_a_worker_no_longer_listed_does_not_count(logs):
    activity = Activity(logs)
    activity.poll()
    assert activity.busy_workers({"9000"}) == 1
    assert activity.busy_workers({"9001"}) == 0  # 9000 died mid-batch and was not restarted


def test_only_new_inference_arrivals_count(logs):
    activity = Activity(logs)
    assert activity.poll() == 0
    append(logs / "ts_metrics.log", ARRIVAL + LATENCY + ARRIVAL)
    assert activity.poll() == 2
    assert activity.poll() == 0
    assert activity.arrivals == 2


def test_follower_skips_a_partial_first_line_and_waits_for_complete_ones(tmp_path):
    path = tmp_path / "x.log"
    path.write_bytes(b"one\ntw")
    follower = LogFollower(path, from_end=True)
    assert follower.lines() == []
    append(path, "o\nthree\nfou")
    assert follower.lines() == ["three"]  # the rest of "two" is dropped, "fou" not complete yet
    append(path, "r\n")
    assert follower.lines() == ["four"]


def test_follower_starts_over_after_rotation(tmp_path):
    path = tmp_path / "x.log"
    path.write_text("a\nb\nc\n")
    follower = LogFollower(path, from_end=True, tail_bytes=4)
    assert follower.lines() == ["b", "c"]
    path.write_text("new\n")  # rotated: smaller than what was read
    assert follower.lines() == ["new"]
