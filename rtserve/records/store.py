"""The records' store in Cassandra: versioned schema, idempotent writes, reads by request id or by model and time.

Two tables, both with the retention as TTL: ``records_by_id`` (``find``) and ``records_by_minute``, one partition
per model and UTC minute (an hour's would pass Cassandra's 100 MB partition guideline; see docs/records.md).
Primary keys come from the record, so a resent batch overwrites the same rows.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import TracebackType

from cassandra import DriverException, RequestValidationException
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, NoHostAvailable, Session
from cassandra.concurrent import execute_concurrent
from cassandra.connection import ConnectionException, DefaultEndPoint
from cassandra.policies import DCAwareRoundRobinPolicy, ExponentialReconnectionPolicy, TokenAwarePolicy
from cassandra.query import BatchStatement, BatchType, BoundStatement, ConsistencyLevel, PreparedStatement

from rtserve.errors import RecordsError, StoreError, StoreSchemaError, StoreUnavailable
from rtserve.records.record import Record

#: The schema version this code writes and reads; ``ensure_schema`` brings a store up to it.
SCHEMA_VERSION = 1
#: The width of a ``records_by_minute`` partition.
BUCKET = timedelta(minutes=1)
#: How far past now a record's time may lie (the writers' clocks): ``latest`` looks that far ahead.
CLOCK_SKEW = timedelta(minutes=1)
#: Write batches in flight at once (the driver's concurrent execution).
CONCURRENCY = 32
#: The records in one write batch, in bytes: a batch's whole size is about 1.4 times its records'
#: (keys, columns), so it stays under Cassandra's batch_size_fail_threshold (50 KiB by default).
BATCH_BYTES = 24 * 1024
#: Partition reads in flight at once while a read walks the minutes.
READ_AHEAD = 16
#: Rows per page of a read.
FETCH_SIZE = 1000
#: The errors that say the store could not do it now (unreachable, overloaded, timed out: the
#: driver's DriverException, its RequestExecutionException among them): retrying the same call
#: later may succeed. (An invalid statement is a DriverException too, caught before these.)
TRANSIENT = (NoHostAvailable, ConnectionException, DriverException)
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,47}")
_COLUMNS = "request_id, time, model, model_version, route, status, record"


def _migrations(keyspace: str, ttl_seconds: int) -> dict[int, tuple[str, ...]]:
    """The statements that bring the schema from the version before each key to that key."""
    ttl = f"default_time_to_live = {ttl_seconds}"
    return {
        1: (
            f"CREATE TABLE IF NOT EXISTS {keyspace}.records_by_id (request_id text PRIMARY KEY, "
            "time timestamp, model text, model_version text, route text, status int, record text) "
            f"WITH {ttl}",
            f"CREATE TABLE IF NOT EXISTS {keyspace}.records_by_minute (model text, minute timestamp, "
            "time timestamp, request_id text, model_version text, route text, status int, "
            "record text, PRIMARY KEY ((model, minute), time, request_id)) "
            f"WITH CLUSTERING ORDER BY (time ASC, request_id ASC) AND {ttl}",
        )
    }


def bucket(when: datetime) -> datetime:
    """The ``records_by_minute`` partition of a time: its UTC minute."""
    utc = when.astimezone(UTC)
    return utc.replace(second=0, microsecond=0)


def _millis(when: datetime) -> datetime:
    """An aware time cut to the milliseconds Cassandra keeps (UTC)."""
    utc = when.astimezone(UTC)
    return utc.replace(microsecond=utc.microsecond // 1000 * 1000)


@contextmanager
def _driver_errors() -> Iterator[None]:
    """Raise the driver's errors as rtserve's: refused as invalid (StoreError), or not now (StoreUnavailable)."""
    try:
        yield
    except RequestValidationException as exc:
        raise StoreError(f"Cassandra refused a statement: {type(exc).__name__}: {exc}") from exc
    except TRANSIENT as exc:
        raise StoreUnavailable(f"Cassandra: {type(exc).__name__}: {exc}") from exc


def _aware(when: datetime, name: str) -> datetime:
    if not isinstance(when, datetime) or when.tzinfo is None:
        raise RecordsError(f"{name} must be a datetime with its time zone, got {when!r}")
    return when.astimezone(UTC)


def _endpoint(point: str) -> DefaultEndPoint:
    if not isinstance(point, str):
        raise RecordsError(f"contact_points: expected host:port, got {point!r}")
    host, sep, port = point.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise RecordsError(f"contact_points: expected host:port, got {point!r}")
    return DefaultEndPoint(host.strip("[]"), int(port))


@dataclass(frozen=True)
class _Statements:
    insert_id: PreparedStatement
    insert_minute: PreparedStatement
    find: PreparedStatement
    ascending: PreparedStatement
    ascending_version: PreparedStatement
    descending: PreparedStatement
    descending_version: PreparedStatement


class Store:
    """A connection to the records' keyspace (thread-safe; one per process is enough).

    Use :meth:`connect`; close it (or use it as a context manager) to end the driver's threads.
    """

    def __init__(self, cluster: Cluster, session: Session, keyspace: str, replication: int, ttl_seconds: int) -> None:
        self._cluster = cluster
        self._session = session
        self.keyspace = keyspace
        self.replication = replication
        self.ttl_seconds = ttl_seconds
        self._statements: _Statements | None = None

    @classmethod
    def connect(
        cls,
        contact_points: Sequence[str],
        keyspace: str = "rtserve",
        replication: int = 1,
        ttl_seconds: int = 30 * 86400,
        timeout: float = 10.0,
    ) -> Store:
        """Connect to the Cassandra nodes at ``contact_points``; the driver finds the rest of the ring from them.

        Args:
            contact_points: at least one ``host:port`` of a node's native protocol (CQL) port.
            keyspace: the records' keyspace (created by :meth:`ensure_schema`).
            replication: the keyspace's replication factor in each data center (at its creation).
            ttl_seconds: how long a record is kept: every write's TTL, and the tables' default.
            timeout: seconds for connecting, and for each request.

        Raises:
            RecordsError: a setting that cannot be used (the message names it).
            StoreUnavailable: no node could be reached within ``timeout``.
        """
        if isinstance(contact_points, str) or not contact_points:
            raise RecordsError(f"contact_points: expected a list of host:port, got {contact_points!r}")
        endpoints = [_endpoint(point) for point in contact_points]
        if not isinstance(keyspace, str) or not _NAME.fullmatch(keyspace):
            raise RecordsError(f"keyspace: expected a letter then up to 47 letters, digits or _, got {keyspace!r}")
        for name, value in (("replication", replication), ("ttl_seconds", ttl_seconds)):
            if type(value) is not int or value < 1:
                raise RecordsError(f"{name}: expected a positive whole number, got {value!r}")
        if not isinstance(timeout, (int, float)) or not timeout > 0:
            raise RecordsError(f"timeout: expected a positive number of seconds, got {timeout!r}")
        profile = ExecutionProfile(
            load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy()),
            consistency_level=ConsistencyLevel.LOCAL_QUORUM,
            request_timeout=timeout,
        )
        # Protocol v5 (Cassandra 4.0 and later): no version negotiation at each connect.
        # A node that comes back is found again within 10 s.
        cluster = Cluster(
            endpoints,
            execution_profiles={EXEC_PROFILE_DEFAULT: profile},
            protocol_version=5,
            connect_timeout=timeout,
            control_connection_timeout=timeout,
            reconnection_policy=ExponentialReconnectionPolicy(0.5, 10.0),
        )
        try:
            session = cluster.connect()
        except (RequestValidationException, *TRANSIENT) as exc:
            cluster.shutdown()
            raise StoreUnavailable(f"cannot reach Cassandra at {', '.join(contact_points)}: {exc}") from exc
        session.default_fetch_size = FETCH_SIZE
        return cls(cluster, session, keyspace, replication, ttl_seconds)

    def close(self) -> None:
        """End the connections and the driver's threads."""
        self._cluster.shutdown()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _execute(self, statement: str | PreparedStatement, params: Sequence | None = None) -> list:
        with _driver_errors():
            return list(self._session.execute(statement, params))

    def schema_version(self) -> int:
        """The store's schema version (0: none yet).

        Raises:
            StoreUnavailable: the store cannot be reached.
        """
        if not self._execute(
            "SELECT table_name FROM system_schema.tables WHERE keyspace_name = %s AND table_name = 'schema_version'",
            (self.keyspace,),
        ):
            return 0
        rows = self._execute(f"SELECT version FROM {self.keyspace}.schema_version WHERE name = 'records'")
        return rows[0].version if rows else 0

    def ensure_schema(self) -> list[int]:
        """Create the keyspace and the tables, or bring them up to :data:`SCHEMA_VERSION`.

        Calling it again does nothing. The keyspace's replication and the tables' default TTL are set at
        creation.

        Returns:
            The versions applied (none when the store was up to date).

        Raises:
            StoreSchemaError: the store's schema is newer than this code knows.
            StoreUnavailable: the store cannot be reached, or a statement failed or timed out.
            StoreError: the node refused a statement as invalid (a user without the right to
                create the keyspace, for one).
        """
        ks = self.keyspace
        found = self.schema_version()
        if found > SCHEMA_VERSION:
            raise StoreSchemaError(
                f"the records keyspace {ks!r} is at schema version {found}; this rtserve knows "
                f"versions up to {SCHEMA_VERSION}: upgrade rtserve",
                found=found,
                known=SCHEMA_VERSION,
            )
        if found == SCHEMA_VERSION:
            return []
        self._execute(
            f"CREATE KEYSPACE IF NOT EXISTS {ks} WITH replication = "
            f"{{'class': 'NetworkTopologyStrategy', 'replication_factor': {self.replication}}}"
        )
        self._execute(
            f"CREATE TABLE IF NOT EXISTS {ks}.schema_version (name text PRIMARY KEY, version int, applied timestamp)"
        )
        applied = []
        for version, statements in sorted(_migrations(ks, self.ttl_seconds).items()):
            if version <= found:
                continue
            for statement in statements:
                self._execute(statement)
            self._execute(
                f"INSERT INTO {ks}.schema_version (name, version, applied) VALUES ('records', %s, toTimestamp(now()))",
                (version,),
            )
            applied.append(version)
        self._statements = None
        return applied

    def _prepared(self) -> _Statements:
        if self._statements is not None:
            return self._statements
        ks = self.keyspace
        scan = (
            f"SELECT {_COLUMNS} FROM {ks}.records_by_minute WHERE model = ? AND minute = ? AND time >= ? AND time < ?"
        )
        texts = {
            "insert_id": f"INSERT INTO {ks}.records_by_id ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?) USING TTL ?",
            "insert_minute": f"INSERT INTO {ks}.records_by_minute (minute, {_COLUMNS}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?) USING TTL ?",
            "find": f"SELECT {_COLUMNS} FROM {ks}.records_by_id WHERE request_id = ?",
            # One partition: filtering by version reads no other partition.
            "ascending": scan,
            "ascending_version": scan + " AND model_version = ? ALLOW FILTERING",
            "descending": scan + " ORDER BY time DESC, request_id DESC LIMIT ?",
            "descending_version": scan + " AND model_version = ? ORDER BY time DESC, "
            "request_id DESC LIMIT ? ALLOW FILTERING",
        }
        try:
            with _driver_errors():
                prepared = {name: self._session.prepare(text) for name, text in texts.items()}
        except StoreError as exc:
            raise StoreSchemaError(
                f"the records tables are missing in keyspace {ks!r} (create "
                f"them with ensure_schema, or make cassandra): {exc}",
                found=0,
                known=SCHEMA_VERSION,
            ) from exc
        self._statements = _Statements(**prepared)
        return self._statements

    def write(self, records: Sequence[Record]) -> None:
        """Write ``records`` into both tables, each row with the store's TTL; writing a record again changes nothing.

        Unlogged batches (see :func:`_batches`), :data:`CONCURRENCY` of them in flight.

        Raises:
            StoreUnavailable: a write failed or timed out (some rows may be written: write the
                same records again later).
            StoreSchemaError: the tables do not exist.
        """
        if not records:
            return
        groups = self._grouped(records)
        batches = [(batch, None) for group in groups.values() for batch in _batches(group)]
        with _driver_errors():
            results = execute_concurrent(self._session, batches, concurrency=CONCURRENCY, raise_on_first_error=False)
        failed = [result for ok, result in results if not ok]
        if failed:
            first = failed[0]
            raise StoreUnavailable(
                f"{len(failed)} of {len(batches)} batches ({2 * len(records)} rows) "
                f"failed; the first: {type(first).__name__}: {first}"
            ) from first

    def _grouped(self, records: Sequence[Record]) -> dict[tuple, list[tuple[int, BoundStatement]]]:
        """Each record's two inserts (with its size), grouped for batching.

        ``records_by_minute``'s by partition, ``records_by_id``'s by their partition's first replica.
        """
        statements = self._prepared()
        ttl = self.ttl_seconds
        metadata = self._cluster.metadata
        groups: dict[tuple, list[tuple[int, BoundStatement]]] = {}
        for r in records:
            if not isinstance(r, Record) or r.time.tzinfo is None:
                raise RecordsError(f"records: expected Records with aware times, got {r!r:.200}")
            when = _millis(r.time)
            size = len(r.line.encode())
            by_id = statements.insert_id.bind(
                (r.request_id, when, r.model, r.model_version, r.route, r.status, r.line, ttl)
            )
            replicas = metadata.get_replicas(self.keyspace, by_id.routing_key)
            groups.setdefault(("id", replicas[0].endpoint if replicas else None), []).append((size, by_id))
            minute = bucket(when)
            by_minute = statements.insert_minute.bind(
                (minute, r.request_id, when, r.model, r.model_version, r.route, r.status, r.line, ttl)
            )
            groups.setdefault(("minute", r.model, minute), []).append((size, by_minute))
        return groups

    def find(self, request_id: str) -> Record | None:
        """The record of ``request_id``, or None.

        Raises:
            StoreUnavailable: the store cannot be reached.
            StoreSchemaError: the tables do not exist.
        """
        if not isinstance(request_id, str) or not request_id:
            raise RecordsError(f"request_id: expected a non-empty string, got {request_id!r}")
        rows = self._execute(self._prepared().find, (request_id,))
        return _record(rows[0]) if rows else None

    def records(
        self,
        model: str,
        since: datetime,
        until: datetime | None = None,
        version: str | None = None,
        limit: int | None = None,
    ) -> Iterator[Record]:
        """The records of ``model`` from ``since`` (inclusive) to ``until`` (exclusive), oldest first.

        ``until`` None: now and :data:`CLOCK_SKEW` past it. Only those of ``version`` when given; at most
        ``limit``. It reads one minute's partition after another (a few ahead at once), lazily: stop
        iterating to stop reading.

        Raises:
            RecordsError: an empty ``model``, ``since`` or ``until`` without a time zone, or
                ``limit`` below 1 (at the call, before any read).
            StoreUnavailable: the store cannot be reached.
            StoreSchemaError: the tables do not exist.
        """
        since, end = _window(model, since, until, limit)
        statements = self._prepared()
        statement = statements.ascending_version if version else statements.ascending
        minutes = _minutes(bucket(since), bucket(end - timedelta(milliseconds=1)), ascending=True)
        extra = (version,) if version else ()
        rows = self._read_ahead(statement, ((model, m, since, end, *extra) for m in minutes))
        return (_record(row) for row in itertools.islice(rows, limit))

    def latest(
        self, model: str, since: datetime, version: str | None = None, limit: int = 100, until: datetime | None = None
    ) -> list[Record]:
        """The newest ``limit`` records of ``model`` at or after ``since``, oldest first.

        Before ``until`` when given; only those of ``version`` when given.

        Raises:
            RecordsError: an empty ``model``, ``since`` or ``until`` without a time zone, or
                ``limit`` below 1 (at the call, before any read).
            StoreUnavailable: the store cannot be reached.
            StoreSchemaError: the tables do not exist.
        """
        since, end = _window(model, since, until, limit, limit_required=True)
        statements = self._prepared()
        statement = statements.descending_version if version else statements.descending
        minutes = _minutes(bucket(since), bucket(end - timedelta(milliseconds=1)), ascending=False)
        extra = (version,) if version else ()
        found: list[Record] = []
        # Each minute's newest `limit` rows, newest minute first, until `limit` are found.
        for row in self._read_ahead(statement, ((model, m, since, end, *extra, limit) for m in minutes)):
            found.append(_record(row))
            if len(found) >= limit:
                break
        return found[::-1]

    def _read_ahead(self, statement: PreparedStatement, params: Iterator[tuple]) -> Iterator:
        """The rows of each parameter set's query, in order, with the next :data:`READ_AHEAD` queries in flight.

        Each query's further pages are fetched as its rows are read.
        """
        pending: list = []
        with _driver_errors():
            while True:
                for nxt in params:
                    pending.append(self._session.execute_async(statement, nxt))
                    if len(pending) >= READ_AHEAD:
                        break
                if not pending:
                    return
                yield from pending.pop(0).result()


def _batches(rows: list[tuple[int, BoundStatement]]) -> Iterator[BatchStatement]:
    """One group's rows (each with its record's size) as unlogged batches of at most :data:`BATCH_BYTES` of records.

    A group is one partition of ``records_by_minute``, or the ``records_by_id`` rows whose
    partitions share their first replica: the token-aware driver sends the batch to that node,
    which holds every row of it. One batch instead of one request per row: 3-4 times the
    records per second and a seventh of the client's CPU per record of concurrent single
    inserts (bench/records_store.py measures both).
    """
    batch, size = BatchStatement(batch_type=BatchType.UNLOGGED), 0
    for row_size, row in rows:
        if size and size + row_size > BATCH_BYTES:
            yield batch
            batch, size = BatchStatement(batch_type=BatchType.UNLOGGED), 0
        batch.add(row)
        size += row_size
    if size:
        yield batch


def _window(
    model: str, since: datetime, until: datetime | None, limit: int | None, limit_required: bool = False
) -> tuple[datetime, datetime]:
    """A read's checked arguments: its start and end as aware UTC times."""
    if not isinstance(model, str) or not model:
        raise RecordsError(f"model: expected a non-empty string, got {model!r}")
    if (limit is not None or limit_required) and (type(limit) is not int or limit < 1):
        raise RecordsError(f"limit: expected a positive whole number, got {limit!r}")
    since = _aware(since, "since")
    end = _aware(until, "until") if until is not None else datetime.now(UTC) + CLOCK_SKEW
    return since, end


def _minutes(first: datetime, last: datetime, ascending: bool) -> Iterator[datetime]:
    """Every minute from ``first`` to ``last`` (both included), in the order asked."""
    count = int((last - first) / BUCKET) + 1
    for i in range(count) if ascending else range(count - 1, -1, -1):
        yield first + i * BUCKET


def _record(row) -> Record:
    return Record(
        row.request_id, row.time.replace(tzinfo=UTC), row.model, row.model_version, row.route, row.status, row.record
    )
