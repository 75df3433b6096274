"""The records' spool and shipper on real files, locks and processes (no server, no store).

The shipper's store here is a list of what it was given: the records tier (tests/records) runs
the same shipper against Apache Cassandra; these tests pin down its bookkeeping (checkpoints,
torn lines, closed segments, making room), which no store can show.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from handler.errors import ConfigError
from handler.records import MIN_SEGMENT_BYTES, RecordsConfig, Spool, iso_time, rejected_inputs, segment_bytes, usage
from rtserve.cli import main
from rtserve.errors import RecordsError, StoreUnavailable
from rtserve.records.lookup import Source, contact_points, export, since
from rtserve.records.record import format_time, parse_line
from rtserve.records.shipper import Shipper, ShipperConfig, ShipperMetrics
from rtserve.records.spool import count_lines, find_local, is_closed, load_checkpoint, segments

pytestmark = pytest.mark.unit

T0 = 1_780_000_000.0


def line(n: int, version: str = "1.0", at: float = T0, model: str = "m") -> str:
    """A record line as the handler writes it (the keys a record must lead with)."""
    return (
        f'{{"request_id":"req-{n}","time":"{iso_time(at + n / 1000)}","model":"{model}",'
        f'"model_version":"{version}","route":"predictions","status":200,"event":"prediction",'
        f'"class":1,"label":"medium","answer":{{"prediction":1}},"inputs":[{n}]}}\n'
    )


class Clock:
    """Monotonic seconds the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class ListStore:
    """A store that keeps what it was given; ``down`` makes every write fail."""

    def __init__(self) -> None:
        self.rows: dict[str, str] = {}
        self.writes = 0
        self.down = False

    def write(self, records) -> None:
        if self.down:
            raise StoreUnavailable("the store is down (test)")
        self.writes += 1
        for record in records:
            self.rows[record.request_id] = record.line


def writer_script(spool: Path, lines: int, hold: bool) -> str:
    """A child process that writes ``lines`` records through the worker's writer, then waits."""
    return (
        f"import sys, time; sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})\n"
        "from handler.records import Spool\n"
        f"s = Spool({str(spool)!r}, 1 << 30)\n"
        f"for n in range({lines}):\n"
        f"    s.append(({line(0)!r}).replace('req-0', f'req-{{n}}').encode())\n"
        "print('written', flush=True)\n" + ("time.sleep(600)\n" if hold else "s.close()\n")
    )


# -- the worker's writer ---------------------------------------------------------------------------
def test_segments_roll_over_and_only_the_open_one_is_locked(tmp_path):
    spool = Spool(str(tmp_path), 64 * MIN_SEGMENT_BYTES)
    assert spool.segment_bytes == 4 * MIN_SEGMENT_BYTES == segment_bytes(64 * MIN_SEGMENT_BYTES)
    data = "".join(line(n) for n in range(40)).encode()
    written = 0
    while written < 2.5 * spool.segment_bytes:
        assert spool.append(data)
        written += len(data)
    found = segments(tmp_path)
    assert len(found) == 3 and [s.closed for s in found] == [True, True, False]
    assert all(s.size >= spool.segment_bytes for s in found[:2])
    assert sum(s.size for s in found) == written == usage(str(tmp_path))
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]  # no half-made segment
    spool.close()
    assert is_closed(found[2].path)


def test_a_full_spool_drops_and_takes_again_once_there_is_room(tmp_path):
    clock = Clock()
    budget = 16 * 4096
    spool = Spool(str(tmp_path), budget, clock=clock)
    data = ("x" * 4000 + "\n").encode()
    kept = sum(spool.append(data) for _ in range(40))
    assert kept == budget // len(data) and spool.full
    assert usage(str(tmp_path)) <= budget
    spool.close()
    for segment in segments(tmp_path):  # the shipper makes room
        segment.path.unlink()
    assert not spool.append(data)  # measured again only after FULL_RECHECK_SECONDS
    clock.now += 1.0
    assert spool.append(data) and not spool.full


def test_other_writers_bytes_count_against_the_budget(tmp_path):
    clock = Clock()
    budget = 64 * 4096
    a, b = Spool(str(tmp_path), budget, clock=clock), Spool(str(tmp_path), budget, clock=clock)
    data = ("y" * 4095 + "\n").encode()
    while a.append(data) and b.append(data):
        clock.now += 0.01
    # each measures the directory at least every budget/256 bytes: the overshoot stays small
    assert usage(str(tmp_path)) <= budget


def test_a_killed_writer_leaves_a_closed_segment_with_every_line_it_wrote(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", writer_script(tmp_path, 50, hold=True)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "written"
        [segment] = segments(tmp_path)
        assert not segment.closed  # its writer holds it
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    [segment] = segments(tmp_path)
    assert segment.closed
    assert [parse_line(t).request_id for t in segment.path.read_text().splitlines()] == [f"req-{n}" for n in range(50)]


def test_records_config_is_checked():
    assert RecordsConfig.from_model_yaml({}) == RecordsConfig(True, True, False)
    assert RecordsConfig.from_model_yaml({"records": {"inputs": False}}).inputs is False
    with pytest.raises(ConfigError, match="unknown records setting"):
        RecordsConfig.from_model_yaml({"records": {"input": False}})
    with pytest.raises(ConfigError, match="records.required must be true or false"):
        RecordsConfig.from_model_yaml({"records": {"required": "yes"}})


def test_rejected_inputs_are_kept_bounded():
    assert rejected_inputs({"body": {"features": [1, 2]}}) == '{"features":[1,2]}'
    assert rejected_inputs({"body": b"not json"}) == '"not json"'
    long = rejected_inputs({"body": {"features": list(range(5000))}})
    assert long.startswith('"{') and len(json.loads(long)) == 2048


# -- the shipper -----------------------------------------------------------------------------------
def shipper(tmp_path, store, **config) -> Shipper:
    return Shipper(ShipperConfig(tmp_path, config.pop("budget", 1 << 30), **config), store, ShipperMetrics())


def write_segment(spool: Path, lines: list[str], name: str) -> Path:
    path = spool / name
    path.write_text("".join(lines))
    return path


def test_the_shipper_ships_in_order_and_a_restart_ships_nothing_twice(tmp_path):
    write_segment(tmp_path, [line(n) for n in range(700)], "0001-1.jsonl")
    store = ListStore()
    first = shipper(tmp_path, store)
    assert first.step() == 500 and first.step() == 200 and first.step() == 0
    assert store.writes == 2 and list(store.rows) == [f"req-{n}" for n in range(700)]
    assert load_checkpoint(tmp_path) == {"0001-1.jsonl": (tmp_path / "0001-1.jsonl").stat().st_size}
    with open(tmp_path / "0001-1.jsonl", "a") as f:  # more written (by a writer since gone)
        f.write(line(700))
    again = shipper(tmp_path, store)  # a new process: the checkpoint says where to go on
    assert again.step() == 1 and store.writes == 3
    assert again.metrics.lag._sum.get() > 0


def test_a_store_that_fails_moves_nothing_and_the_records_go_later(tmp_path):
    write_segment(tmp_path, [line(n) for n in range(10)], "0001-1.jsonl")
    store = ListStore()
    store.down = True
    ship = shipper(tmp_path, store)
    with pytest.raises(StoreUnavailable):
        ship.step()
    assert load_checkpoint(tmp_path) == {} and ship.totals["store_errors"] == 1
    store.down = False
    assert ship.step() == 10 and len(store.rows) == 10


def test_a_torn_last_line_of_a_dead_writer_is_passed_over_and_an_open_one_waits(tmp_path):
    torn = write_segment(tmp_path, [line(0), line(1)[:30]], "0001-1.jsonl")  # closed: no lock
    store = ListStore()
    ship = shipper(tmp_path, store)
    assert ship.step() == 1 and ship.step() == 0
    assert ship.totals["torn"] == 1 and load_checkpoint(tmp_path)["0001-1.jsonl"] == torn.stat().st_size
    # an open segment's partial line waits for the rest
    proc = subprocess.Popen(
        [sys.executable, "-c", writer_script(tmp_path, 3, hold=True)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "written"
        [_, open_segment] = segments(tmp_path)
        with open(open_segment.path, "a") as f:
            f.write(line(9)[:20])
        assert ship.step() == 3 and ship.step() == 0 and ship.totals["torn"] == 1
    finally:
        proc.kill()
        proc.wait(10)


def test_lines_that_are_not_records_are_counted_and_skipped(tmp_path):
    write_segment(tmp_path, [line(0), "not json\n", '{"request_id":"x"}\n', line(1)], "0001-1.jsonl")
    store = ListStore()
    ship = shipper(tmp_path, store)
    assert ship.step() == 2 and ship.totals["invalid"] == 2 and set(store.rows) == {"req-0", "req-1"}


def test_room_is_made_from_shipped_closed_segments_only_and_without_a_store_from_any_closed(tmp_path):
    sizes = [
        write_segment(tmp_path, [line(100 * k + n) for n in range(100)], f"000{k}-1.jsonl").stat().st_size
        for k in range(4)
    ]
    store = ListStore()
    store.down = True
    ship = shipper(tmp_path, store, budget=2 * (sizes[2] + sizes[3] + 500), keep=0.5)  # + the checkpoint
    with pytest.raises(StoreUnavailable):
        ship.step()
    assert len(segments(tmp_path)) == 4  # nothing shipped: nothing deleted, whatever the budget
    store.down = False
    while ship.step():
        pass
    assert [s.name for s in segments(tmp_path)] == ["0002-1.jsonl", "0003-1.jsonl"]  # oldest went
    assert set(load_checkpoint(tmp_path)) == {"0002-1.jsonl", "0003-1.jsonl"}
    local = shipper(tmp_path, None, budget=2 * (sizes[3] + 500), keep=0.5)
    local.step()
    assert [s.name for s in segments(tmp_path)] == ["0003-1.jsonl"] and local.totals["evicted"] == 100


def test_without_a_store_a_look_lists_the_segments_only_when_room_is_due(tmp_path, monkeypatch):
    import rtserve.records.shipper as shipper_module

    size = write_segment(tmp_path, [line(n) for n in range(100)], "0001-1.jsonl").stat().st_size
    write_segment(tmp_path, [line(100 + n) for n in range(50)] + ['{"torn'], "0002-1.jsonl")
    listed = []
    monkeypatch.setattr(shipper_module, "segments", lambda d: listed.append(d) or segments(d))
    local = shipper(tmp_path, None, budget=4 * size, keep=0.5)
    assert local.step() == 0 and not listed  # under half the budget: no listing, no lock taken
    local = shipper(tmp_path, None, budget=2 * size, keep=0.5)
    local.step()
    assert listed and [s.name for s in segments(tmp_path)] == ["0002-1.jsonl"]
    assert local.totals["evicted"] == 100 and count_lines(tmp_path / "0002-1.jsonl") == 50


def test_drain_ships_everything_there_is_then_says_so(tmp_path):
    write_segment(tmp_path, [line(n) for n in range(1200)], "0001-1.jsonl")
    store = ListStore()
    assert shipper(tmp_path, store).drain(time.monotonic() + 30) and len(store.rows) == 1200


# -- lookups ---------------------------------------------------------------------------------------
def test_since_takes_spans_and_times():
    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    assert since("10m", now) == now - timedelta(minutes=10)
    assert since("1d", now) == now - timedelta(days=1)
    assert since("2026-12-01T11:00:00Z") == now - timedelta(hours=1)
    with pytest.raises(RecordsError, match="--since must be"):
        since("yesterday")
    assert contact_points("a:9042, b:9043") == ["a:9042", "b:9043"]
    with pytest.raises(RecordsError, match="host:port"):
        contact_points("a")


def test_parse_line_needs_the_leading_keys():
    record = parse_line(line(3))
    assert (record.request_id, record.model_version, record.status) == ("req-3", "1.0", 200)
    assert format_time(record.time) == iso_time(T0 + 0.003)
    for bad in (
        '{"request_id":"x"}',
        "[]",
        '{"request_id":"x","time":"now","model":"m","model_version":"1","route":"r","status":200}',
    ):
        with pytest.raises(RecordsError):
            parse_line(bad)


def run_dir_with_spool(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    (run / "records").mkdir(parents=True)
    now = time.time()
    lines = [line(n, "1.0" if n % 2 else "2.0", at=now - 3600) for n in range(10)]
    lines += [line(n, "1.0" if n % 2 else "2.0", at=now) for n in range(10, 20)]
    write_segment(run / "records", lines, "0001-1.jsonl")
    return run


def test_without_a_store_lookups_read_the_local_spool(tmp_path, capsys):
    run = run_dir_with_spool(tmp_path)
    source = Source.of(run)
    assert source.store is None and "local spool" in source.describe()
    assert find_local(run / "records", "req-12").request_id == "req-12"
    recent = source.latest("m", since("10m"), None, 4)
    assert [r.request_id for r in recent] == [f"req-{n}" for n in range(16, 20)]
    assert [r.request_id for r in source.window("m", since("2h"), "1.0")] == [f"req-{n}" for n in range(1, 20, 2)]
    assert export(source.window("m", since("10m"), "2.0"), tmp_path / "out.jsonl") == 5
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 5

    assert main(["records", "find", "req-12", "--run-dir", str(run), "--model", "m"]) == 0
    assert json.loads(capsys.readouterr().out)["request_id"] == "req-12"
    assert main(["records", "find", "nobody", "--run-dir", str(run)]) == 3
    assert (
        main(
            [
                "records",
                "list",
                "--since",
                "10m",
                "--version",
                "1.0",
                "--run-dir",
                str(run),
                "--model",
                "m",
                "--limit",
                "2",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out.splitlines()
    assert [json.loads(t)["request_id"] for t in out] == ["req-17", "req-19"]


def test_a_server_started_with_a_store_is_read_from_it(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.properties").write_text("rtserve_records_store=127.0.0.1:9042\nrtserve_records_keyspace=ks\n")
    source = Source.of(run)
    assert source.store == ["127.0.0.1:9042"] and source.keyspace == "ks"
    assert Source.of(run, store="").store is None  # an explicit empty store: the local spool


def test_a_writer_that_measured_long_ago_still_keeps_the_budget(tmp_path):
    """The other writer filled the spool since this one last measured (within its second and
    its 1/256 of the budget): near the budget each batch measures under the directory's lock,
    so the directory never passes the budget."""
    clock = Clock()
    budget = 64 * 4096
    stale, busy = Spool(str(tmp_path), budget, clock=clock), Spool(str(tmp_path), budget, clock=clock)
    data = ("z" * 1023 + "\n").encode()
    assert stale.append(data)  # measured: nearly empty
    while busy.append(data):
        pass
    assert busy.full and usage(str(tmp_path)) <= budget
    kept = sum(stale.append(data) for _ in range(8))  # no time passed, few bytes of its own
    assert kept == 0 and stale.full
    assert usage(str(tmp_path)) <= budget
