"""The records store's pure parts: the minute a record's partition is, the minutes a read walks,
how a group of rows is cut into batches, and the settings ``Store.connect`` refuses before it
reaches for any node (the records tier runs the rest against a real Cassandra)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from cassandra import InvalidRequest, OperationTimedOut
from cassandra.cluster import NoHostAvailable

from rtserve.errors import RecordsError, StoreError, StoreUnavailable
from rtserve.records import store
from rtserve.records.store import Store

pytestmark = pytest.mark.unit

UTC = UTC


def test_a_records_partition_is_its_utc_minute():
    when = datetime(2026, 12, 1, 20, 59, 59, 999000, tzinfo=timezone(timedelta(hours=2)))
    assert store.bucket(when) == datetime(2026, 12, 1, 18, 59, tzinfo=UTC)
    assert store.bucket(datetime(2026, 12, 1, 19, 0, tzinfo=UTC)) == datetime(2026, 12, 1, 19, 0, tzinfo=UTC)


def test_a_read_walks_every_minute_between_both_ends_in_the_order_asked():
    first = datetime(2026, 12, 1, 23, 58, tzinfo=UTC)
    last = datetime(2026, 12, 2, 0, 1, tzinfo=UTC)
    up = list(store._minutes(first, last, ascending=True))
    assert up == [first + timedelta(minutes=i) for i in range(4)]
    assert list(store._minutes(first, last, ascending=False)) == up[::-1]
    assert list(store._minutes(last, first, ascending=True)) == []


def test_a_group_is_cut_into_batches_of_at_most_the_batch_bytes_keeping_its_order():
    rows = [(10_000, f"row{i}") for i in range(7)]  # the batch holds what it is given
    batches = list(store._batches(rows))
    sizes = [len(b._statements_and_parameters) for b in batches]
    per_batch = store.BATCH_BYTES // 10_000
    assert sizes == [per_batch] * (7 // per_batch) + ([7 % per_batch] if 7 % per_batch else [])
    assert all(b.batch_type.name == "UNLOGGED" for b in batches)
    # a record larger than the limit still goes, alone
    assert [len(b._statements_and_parameters) for b in store._batches([(10**6, "big"), (1, "small")])] == [1, 1]


@pytest.mark.parametrize(
    "kwargs, named",
    [
        ({"contact_points": "127.0.0.1:9042"}, "contact_points"),
        ({"contact_points": []}, "contact_points"),
        ({"contact_points": ["127.0.0.1"]}, "contact_points"),
        ({"contact_points": ["127.0.0.1:99999"]}, "contact_points"),
        ({"contact_points": [":9042"]}, "contact_points"),
        ({"keyspace": "records-1"}, "keyspace"),
        ({"keyspace": "1records"}, "keyspace"),
        ({"replication": 0}, "replication"),
        ({"ttl_seconds": 1.5}, "ttl_seconds"),
        ({"timeout": 0}, "timeout"),
    ],
)
def test_a_setting_that_cannot_be_used_is_refused_naming_it_before_any_connection(kwargs, named):
    args = {"contact_points": ["127.0.0.1:1"], **kwargs}
    with pytest.raises(RecordsError, match=rf"^{named}: expected"):
        Store.connect(**args)


@pytest.mark.parametrize(
    "args, named",
    [
        (("", datetime.now(UTC), None, None), "model"),
        (("m", datetime(2026, 12, 1), None, None), "since"),
        (("m", datetime.now(UTC), datetime(2026, 12, 1), None), "until"),
        (("m", datetime.now(UTC), None, 0), "limit"),
        (("m", datetime.now(UTC), None, "10"), "limit"),
    ],
)
def test_a_read_with_arguments_that_cannot_be_used_is_refused_naming_them(args, named):
    with pytest.raises(RecordsError, match=rf"^{named}: expected|^{named} must be"):
        store._window(*args)
    with pytest.raises(RecordsError, match=r"^limit: expected a positive whole number, got None"):
        store._window("m", datetime.now(UTC), None, None, limit_required=True)


def test_a_read_without_an_end_reads_up_to_now_and_the_writers_clock_skew():
    since = datetime(2026, 12, 1, 19, 0, tzinfo=timezone(timedelta(hours=1)))
    start, end = store._window("m", since, None, None)
    assert start == since and start.tzinfo == UTC
    assert abs(end - datetime.now(UTC) - store.CLOCK_SKEW) < timedelta(seconds=5)


@pytest.mark.parametrize(
    "raised, expected",
    [
        (NoHostAvailable("Unable to connect to any servers", {}), StoreUnavailable),
        (OperationTimedOut("timed out"), StoreUnavailable),
        (InvalidRequest("unconfigured table"), StoreError),
    ],
)
def test_the_drivers_errors_become_unavailable_or_refused(raised, expected):
    with pytest.raises(expected) as caught:
        with store._driver_errors():
            raise raised
    assert caught.value.__cause__ is raised
    assert type(raised).__name__ in str(caught.value)
