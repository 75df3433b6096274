"""The load generator's counts (bench/loadgen.py): first tries apart from what a resend made of them."""

from __future__ import annotations

import pytest

from bench.loadgen import NO_ANSWER, Counts, Record, summarize

pytestmark = pytest.mark.unit

DIED = '507: {"code": 507, "type": "InternalServerException", "message": "Worker died."}'


def record(phase: str, first: int, final: int | None = None, start: float = 0.0, refused: bool = False) -> Record:
    """A request whose first try got ``first`` and, when resent, ``final``."""
    resent = final is not None
    final = first if final is None else final
    error = lambda status: "" if status == 200 else (DIED if status == 507 else f"{status}: x")  # noqa: E731
    return Record(
        start,
        0.01,
        final,
        "1.0" if final == 200 else None,
        phase,
        error(final),
        refused,
        first_status=first,
        first_error=error(first),
        resent=resent,
    )


def test_a_resent_request_counts_as_failed_on_its_first_try():
    records = [
        record("a", 200),
        record("a", 507, 200),
        record("a", 507, 507),
        record("a", 0, refused=True),
        record("a", 503),
    ]
    counts = Counts.of(records)
    assert counts == Counts(
        sent=5,
        failed_first=4,
        failed_first_by_status={"503": 1, "507": 2, NO_ANSWER: 1},
        resent=2,
        failed_after_resend=3,
    )
    assert counts.text() == (
        "failed on the first try: 4 (503: 1, 507: 2, no answer: 1), resent: 2, failed after resending: 3"
    )
    assert Counts.read({**vars(counts), "other": "kept out"}) == counts


def test_phases_count_their_own_first_tries_and_errors():
    records = [
        record("baseline", 200, start=0.0),
        record("down", 507, 200, start=1.0),
        record("down", 200, start=1.1),
        record("baseline", 200, start=0.5),
    ]
    baseline, down = summarize(records)
    assert (baseline.phase, baseline.sent, baseline.failed_first, baseline.resent) == ("baseline", 2, 0, 0)
    assert baseline.errors == [] and baseline.versions == {"1.0": 2}
    assert (down.phase, down.sent, down.failed_first, down.resent, down.failed_after_resend) == ("down", 2, 1, 1, 0)
    assert down.failed_first_by_status == {"507": 1} and down.errors == [DIED]
    assert down.versions == {"1.0": 2}  # the resend was answered


def test_payloads_are_sent_in_turn_and_each_record_names_its_own():
    """A loopback server answers each body's first feature as its version: every good request's
    record names the payload it sent, the payloads take turns across the senders, and the bad
    requests send the bad body."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from bench.loadgen import SteadyLoad

    class Echo(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            features = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["features"]
            ok = len(features) == 2
            body = json.dumps({"model_version": f"{features[0]:g}"} if ok else {"field": "features"}).encode()
            self.send_response(200 if ok else 400)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        load = SteadyLoad(
            f"http://127.0.0.1:{server.server_address[1]}/",
            {"features": [9.0, 9.0]},
            lambda: None,
            rate=300,
            concurrency=3,
            max_requests=90,
            bad_every=5,
            payloads=[{"features": [float(i), 0.0]} for i in range(4)],
        ).start()
        while load.done < 90:
            threading.Event().wait(0.05)
        records = load.stop()
    finally:
        server.shutdown()
    good = [r for r in records if not r.bad]
    assert len(good) >= 70 and all(r.status == 200 and r.version == str(r.payload) for r in good)
    turns = [sum(r.payload == i for r in good) for i in range(4)]
    assert max(turns) - min(turns) <= 1, turns
    assert all(r.status == 400 for r in records if r.bad) and any(r.bad for r in records)
