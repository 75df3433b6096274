"""The records store on a real node (`make cassandra`): the schema once however often it is
created, a record written twice is one row in each table, find / records / latest by time,
version and since, every row with its TTL, and StoreUnavailable while the node is down, the same
write going through once it is back; `make cassandra`, `cassandra-status` and `cassandra-stop`
say what they did."""

from __future__ import annotations

import json
import re
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from rtserve import cli
from rtserve.errors import StoreSchemaError, StoreUnavailable
from rtserve.records import local, store
from rtserve.records.record import Record, format_time, parse_line
from rtserve.records.store import Store
from tests.helpers import make
from tests.records.conftest import node_processes

pytestmark = pytest.mark.records

UTC = UTC
TABLES = {"schema_version", "records_by_id", "records_by_minute"}


def record(
    model: str, when: datetime, version: str = "1.0", status: int = 200, request_id: str | None = None
) -> Record:
    """A record as the worker writes it (its line's leading keys, then the answer)."""
    doc = {
        "request_id": request_id or uuid.uuid4().hex,
        "time": format_time(when),
        "model": model,
        "model_version": version,
        "route": "predictions",
        "status": status,
        "answer": {"class": 1, "probabilities": [0.25, 0.75]},
        "inputs": [0.5] * 30,
    }
    return parse_line(json.dumps(doc))


def fresh_keyspace() -> str:
    return f"test_{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="module")
def records_store(cassandra):
    with Store.connect([cassandra.address], timeout=30.0) as connected:
        yield connected


@pytest.fixture()
def keyspace(cassandra):
    """A keyspace of the test's own, dropped afterwards."""
    name = fresh_keyspace()
    yield name
    with Store.connect([cassandra.address], timeout=30.0) as s:
        s._execute(f"DROP KEYSPACE IF EXISTS {name}")


def tables(s: Store, keyspace: str) -> dict[str, int]:
    """The keyspace's tables with their default TTL."""
    rows = s._execute(
        "SELECT table_name, default_time_to_live FROM system_schema.tables WHERE keyspace_name = %s", (keyspace,)
    )
    return {row.table_name: row.default_time_to_live for row in rows}


def test_make_cassandra_starts_a_node_with_the_records_schema(cassandra, records_store, capsys):
    out = cassandra.start_output
    assert re.search(
        r"^>> Cassandra ready in [\d.]+ s \(node ready [\d.]+ s, schema [\d.]+ s\); "
        rf"data and logs in {cassandra.run_dir}$",
        out,
        re.M,
    ), out
    assert re.search(rf"^  address:  {cassandra.address} \(CQL; storage port \d+\)$", out, re.M), out
    assert cassandra.address.startswith("127.0.0.1:")
    assert records_store.schema_version() == store.SCHEMA_VERSION
    assert tables(records_store, "rtserve") == {
        "schema_version": 0,
        "records_by_id": 30 * 86400,
        "records_by_minute": 30 * 86400,
    }
    status = make("-s", "cassandra-status", *cassandra.make_vars)
    assert status.returncode == 0, status.stdout
    pid = local.pid(cassandra.run_dir)
    assert f"  cassandra  running (pid {pid})\n" in status.stdout
    assert f"  address    {cassandra.address}\n" in status.stdout
    rss = re.search(r"^  rss        (\d+) MiB$", status.stdout, re.M)
    assert rss and int(rss[1]) > 100, status.stdout
    assert cli.main(["cassandra", "address", "--run-dir", str(cassandra.run_dir)]) == 0
    assert capsys.readouterr().out == f"{cassandra.address}\n"
    twice = make("-s", "cassandra", *cassandra.make_vars)  # one node per run directory
    assert twice.returncode != 0, twice.stdout
    assert (
        f"error: a Cassandra node already runs from {cassandra.run_dir} (pid {pid}): stop it first "
        "(make cassandra-stop)" in twice.stdout
    )
    for name in ("data/data", "data/commitlog", "logs/system.log", "logs/cassandra.out"):
        assert (cassandra.run_dir / name).exists(), name
    assert "Startup complete" in (cassandra.run_dir / "logs" / "system.log").read_text()


def test_the_schema_created_twice_is_one_schema(cassandra, keyspace):
    with Store.connect([cassandra.address], keyspace=keyspace, ttl_seconds=7200) as s:
        assert s.schema_version() == 0
        assert s.ensure_schema() == [1]
        first = tables(s, keyspace)
        assert first == {"schema_version": 0, "records_by_id": 7200, "records_by_minute": 7200}
    with Store.connect([cassandra.address], keyspace=keyspace, ttl_seconds=7200) as again:
        assert again.ensure_schema() == []  # nothing applied
        assert again.ensure_schema() == []
        assert tables(again, keyspace) == first
        rows = again._execute(f"SELECT name, version FROM {keyspace}.schema_version")
        assert [(r.name, r.version) for r in rows] == [("records", 1)]


def test_a_store_at_a_newer_schema_version_is_refused(cassandra, keyspace):
    with Store.connect([cassandra.address], keyspace=keyspace) as s:
        s.ensure_schema()
        s._execute(f"UPDATE {keyspace}.schema_version SET version = 2 WHERE name = 'records'")
    with Store.connect([cassandra.address], keyspace=keyspace) as newer:
        with pytest.raises(
            StoreSchemaError,
            match=rf"the records keyspace '{keyspace}' is at schema "
            r"version 2; this rtserve knows versions up to 1",
        ) as err:
            newer.ensure_schema()
        assert (err.value.found, err.value.known) == (2, store.SCHEMA_VERSION)


def test_writing_before_the_schema_exists_names_it(cassandra, keyspace):
    with Store.connect([cassandra.address], keyspace=keyspace) as s:
        with pytest.raises(
            StoreSchemaError,
            match=rf"the records tables are missing in keyspace "
            rf"'{keyspace}' \(create them with ensure_schema",
        ):
            s.write([record("m", datetime.now(UTC))])


def test_a_record_written_twice_is_one_row_in_each_table(records_store):
    model = f"twice-{uuid.uuid4().hex[:8]}"
    one = record(model, datetime.now(UTC) - timedelta(seconds=5))
    records_store.write([one])
    records_store.write([one, one])
    ks = records_store.keyspace
    by_id = records_store._execute(
        f"SELECT count(*) AS n FROM {ks}.records_by_id WHERE request_id = %s", (one.request_id,)
    )
    by_minute = records_store._execute(
        f"SELECT count(*) AS n FROM {ks}.records_by_minute WHERE model = %s AND minute = %s",
        (model, store.bucket(one.time)),
    )
    assert (by_id[0].n, by_minute[0].n) == (1, 1)
    assert records_store.find(one.request_id) == one


def test_find_records_and_latest_by_time_version_and_since(records_store):
    model = f"reads-{uuid.uuid4().hex[:8]}"
    start = store.bucket(datetime.now(UTC)) - timedelta(minutes=150)
    # 12 records over 3 hours' worth of minutes (10 minutes apart, so 12 partitions), two versions
    written = [
        record(
            model,
            start + timedelta(minutes=10 * i, seconds=7, milliseconds=i),
            version="2.0" if i % 3 == 0 else "1.0",
            status=400 if i == 5 else 200,
        )
        for i in range(12)
    ]
    other = record(f"{model}-other", start + timedelta(minutes=1))
    records_store.write([*written[::-1], other])  # order of writing does not matter

    assert records_store.find(written[5].request_id) == written[5]
    assert records_store.find(written[5].request_id).document["status"] == 400
    assert records_store.find("no-such-request") is None

    since = start - timedelta(minutes=1)
    assert list(records_store.records(model, since)) == written
    assert list(records_store.records(model, written[4].time)) == written[4:]  # since: inclusive
    assert list(records_store.records(model, since, until=written[4].time)) == written[:4]  # until: not
    assert list(records_store.records(model, since, version="2.0")) == written[::3]
    assert list(records_store.records(model, since, limit=5)) == written[:5]
    assert (
        list(records_store.records(model, since, version="1.0", limit=3))
        == [r for r in written if r.model_version == "1.0"][:3]
    )

    assert records_store.latest(model, since, limit=3) == written[-3:]
    assert records_store.latest(model, since, limit=100) == written
    assert records_store.latest(model, since, version="2.0", limit=2) == written[::3][-2:]
    assert records_store.latest(model, written[10].time, limit=5) == written[10:]
    assert records_store.latest(model, since, until=written[3].time, limit=2) == written[1:3]
    assert records_store.latest(f"{model}-none", since) == []


def test_every_row_carries_the_stores_ttl_and_expires_with_it(cassandra, records_store):
    model = f"ttl-{uuid.uuid4().hex[:8]}"
    with (
        Store.connect([cassandra.address], ttl_seconds=3600) as hour,
        Store.connect([cassandra.address], ttl_seconds=2) as brief,
    ):
        kept = record(model, datetime.now(UTC))
        hour.write([kept])
        gone = record(model, datetime.now(UTC))
        brief.write([gone])
    ks = records_store.keyspace
    for table, where, params in (
        ("records_by_id", "request_id = %s", (kept.request_id,)),
        ("records_by_minute", "model = %s AND minute = %s AND time = %s", (model, store.bucket(kept.time), kept.time)),
    ):
        (row,) = records_store._execute(f"SELECT TTL(record) AS ttl FROM {ks}.{table} WHERE {where}", params)
        assert row.ttl is not None and 3600 - 60 < row.ttl <= 3600, (table, row.ttl)
    assert records_store.find(gone.request_id) == gone
    time.sleep(3)
    assert records_store.find(gone.request_id) is None
    assert list(records_store.records(model, kept.time - timedelta(minutes=1))) == [kept]


def test_store_unavailable_while_the_node_is_down_and_the_same_write_after(cassandra, records_store):
    model = f"down-{uuid.uuid4().hex[:8]}"
    before = record(model, datetime.now(UTC) - timedelta(seconds=30))
    records_store.write([before])
    pid = local.pid(cassandra.run_dir)
    assert pid is not None and node_processes(cassandra.run_dir) == [pid]

    stopped = make("-s", "cassandra-stop", *cassandra.make_vars)
    assert stopped.returncode == 0, stopped.stdout
    assert re.fullmatch(
        rf">> cassandra \(pid {pid}\) stopped in [\d.]+ s; data kept in {cassandra.run_dir}\n", stopped.stdout
    ), stopped.stdout
    assert node_processes(cassandra.run_dir) == [] and local.pid(cassandra.run_dir) is None
    status = make("-s", "cassandra-status", *cassandra.make_vars)
    assert status.returncode != 0 and "  cassandra  stopped\n" in status.stdout, status.stdout
    again = make("-s", "cassandra-stop", *cassandra.make_vars)
    assert again.returncode == 0 and again.stdout == f">> no Cassandra node runs from {cassandra.run_dir}\n"

    batch = [record(model, datetime.now(UTC) - timedelta(seconds=i)) for i in range(20)]
    begin = time.monotonic()
    with pytest.raises(StoreUnavailable, match=r"NoHostAvailable"):
        records_store.write(batch)
    assert time.monotonic() - begin < 15  # refused, not hung
    with pytest.raises(StoreUnavailable, match=rf"cannot reach Cassandra at {cassandra.address}"):
        Store.connect([cassandra.address], timeout=5.0)

    restarted = make("-s", "cassandra", *cassandra.make_vars)
    assert restarted.returncode == 0, restarted.stdout
    assert f"  address:  {cassandra.address} (CQL" in restarted.stdout  # the same address again
    deadline = time.monotonic() + 60  # the driver reconnects within its 10 s backoff
    while True:
        try:
            records_store.write(batch)
            break
        except StoreUnavailable:
            assert time.monotonic() < deadline, "the store did not take the write within 60 s of the restart"
            time.sleep(1)
    assert [records_store.find(r.request_id) for r in batch] == batch
    assert records_store.find(before.request_id) == before  # the data outlived the restart


def test_a_fresh_start_deletes_the_records_and_keeps_the_address(cassandra, records_store):
    kept = record(f"fresh-{uuid.uuid4().hex[:8]}", datetime.now(UTC))
    records_store.write([kept])
    assert make("-s", "cassandra-stop", *cassandra.make_vars).returncode == 0
    fresh = make("-s", "cassandra", "CASSANDRA_FRESH=1", *cassandra.make_vars)
    assert fresh.returncode == 0, fresh.stdout
    assert f"  address:  {cassandra.address} (CQL" in fresh.stdout
    with Store.connect([cassandra.address], timeout=30.0) as after:
        assert after.schema_version() == store.SCHEMA_VERSION  # created again
        assert after.find(kept.request_id) is None
