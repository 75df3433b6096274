"""The c=1 tail attribution's arithmetic (bench/tail.py): reading ``perf sched timehist``, the
thread kinds, and what each request's window is charged with."""

from __future__ import annotations

import pytest

from bench.tail import Window, attribute, classify, read_trace, summarize

pytestmark = pytest.mark.unit

FRONTEND, WORKER, CLIENT = 100, 200, 300
KIND = classify(FRONTEND, {WORKER}, CLIENT)

TIMEHIST = """\
           time    cpu  task name                       wait time  sch delay   run time
                        [tid/pid]                          (msec)     (msec)     (msec)
--------------- ------  ------------------------------  ---------  ---------  ---------
      10.001000 [0000]  epollEventLoopG[101/100]            0.500      2.000      0.100
      10.002000 [0001]  C2 CompilerThre[105/100]            0.000      0.000      1.500
      10.002500 [0000]  python[200]                         0.100      0.050      0.300
      10.003000 [0001]  <idle>                                0.000      0.000      1.000
"""


def test_threads_are_sorted_into_the_chain_and_the_rest():
    assert KIND(101, FRONTEND, "epollEventLoopG") == "frontend Netty"
    assert KIND(102, FRONTEND, "W-9000-realtime") == "frontend W- threads"
    assert KIND(105, FRONTEND, "C2 CompilerThre") == "frontend C CompilerThre"
    assert KIND(WORKER, None, "python") == "worker main thread"
    assert KIND(201, WORKER, "Thread-2 (drift)") == "worker thread Thread- (drift)"
    assert KIND(CLIENT, None, "python") == "client"
    assert KIND(999, None, "podman") == "other: podman"


def test_a_timehist_line_is_a_run_after_its_scheduling_delay():
    slices = read_trace(TIMEHIST, KIND)
    assert [s.kind for s in slices] == ["frontend C CompilerThre", "frontend Netty", "worker main thread"]
    netty = slices[1]
    assert netty.start == pytest.approx(10.0009) and netty.end == pytest.approx(10.001)
    assert netty.woken == pytest.approx(10.0009 - 0.002)


def test_a_window_is_charged_with_the_chains_waits_and_the_others_runs_inside_it():
    slices = read_trace(TIMEHIST, KIND)
    w = Window(start=10.0, end=10.0025, request_id="a")
    attribute([w], slices, longest_run=max(s.end - s.start for s in slices))
    # Netty waited from 9.9989 to 10.0009: 0.9 ms of it inside the window
    assert w.delay_ms["frontend Netty"] == pytest.approx(0.9)
    assert w.delay_ms["worker main thread"] == pytest.approx(0.05)
    # the compiler ran 10.0005-10.002 (1.5 ms); the idle core is not read
    assert w.others_ms == {"frontend C CompilerThre": pytest.approx(1.5)}


def test_a_set_is_summarized_per_request():
    a = Window(0.0, 0.002, "a", handler_ms=0.2, delay_ms={"client": 1.0}, others_ms={"x": 2.0})
    b = Window(0.0, 0.004, "b", handler_ms=None, delay_ms={}, others_ms={})
    out = summarize([a, b], "slow")
    assert out["latency_ms"] == pytest.approx(3.0) and out["handler_ms"] == 0.2
    assert out["delay_ms"]["client"] == 0.5 and out["delay_ms"]["frontend Netty"] == 0.0
    assert out["others_ms"] == {"x": 1.0}
