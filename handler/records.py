"""Records: one JSON line per answered or rejected request, appended by the worker to its spool.

No torch and no TorchServe: rtserve's spool reader and shipper import the constants, and it lives in the
handler because each archive carries the handler without rtserve. A line starts with ``request_id``,
``time``, ``model``, ``model_version``, ``route``, ``status``; inputs are base64 float32 (docs/records.md).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
from binascii import b2a_base64
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from handler.errors import ConfigError, HandlerError

logger = logging.getLogger(__name__)

#: The spool directory and its byte budget (rtserve's server sets both for the workers).
SPOOL_DIR_ENV = "RTSERVE_RECORDS_DIR"
SPOOL_BYTES_ENV = "RTSERVE_SPOOL_BYTES"
DEFAULT_SPOOL_BYTES = 256 * 1024 * 1024
SEGMENT_SUFFIX = ".jsonl"
#: A segment rolls over at 1/16 of the budget, within these bounds.
MIN_SEGMENT_BYTES = 64 * 1024
MAX_SEGMENT_BYTES = 16 * 1024 * 1024
#: The writer measures the directory at least this often (seconds), and at least every
#: 1/:data:`MEASURE_SHARE` of the budget written.
MEASURE_SECONDS = 1.0
MEASURE_SHARE = 256
#: Within 1/NEAR_SHARE of the budget, a batch measures and writes under the directory's lock;
#: the mark says so to every writer (empty: it takes no room; no segment's name).
NEAR_SHARE = 8
NEAR_MARK = ".near"
#: While the spool is full, a batch measures again at most this often (seconds).
FULL_RECHECK_SECONDS = 0.2
#: A client may name the route its request came through (the stream consumer sends ``stream``).
ROUTE_HEADER = "X-Rtserve-Route"
#: Rejected requests keep at most this many characters of what they sent.
REJECTED_INPUT_CHARS = 2048
#: How often (seconds) a worker that drops records says so in its log.
DROP_LOG_SECONDS = 10.0


@dataclass(frozen=True)
class RecordsConfig:
    """The model config's ``records:`` section.

    Attributes:
        enabled: keep a record of every answered or rejected request.
        inputs: keep the request's inputs in its record (false for data a user may not keep).
        required: when a record cannot be kept (the spool is full because the store stays
            away), answer 503 instead of answering without a record.
    """

    enabled: bool = True
    inputs: bool = True
    required: bool = False

    @classmethod
    def from_model_yaml(cls, model_yaml: Mapping[str, Any] | None) -> RecordsConfig:
        """Build from the whole model-config YAML.

        Raises:
            ConfigError: ``records`` is not a mapping, has an unknown key or a non-boolean value.
        """
        section = (model_yaml or {}).get("records")
        if section is None:
            return cls()
        if not isinstance(section, Mapping):
            raise ConfigError("model config: 'records' must be a mapping")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(section) - known)
        if unknown:
            raise ConfigError(f"model config: unknown records setting(s): {', '.join(unknown)}")
        for name, value in section.items():
            if type(value) is not bool:
                raise ConfigError(f"model config: records.{name} must be true or false, got {value!r}")
        return cls(**section)


class RecordsUnavailable(HandlerError):
    """HTTP 503: ``records.required`` is set and this request's record cannot be kept."""

    status = 503
    headers = {"Retry-After": "5"}


def spool_dir() -> str:
    """The spool directory.

    ``$RTSERVE_RECORDS_DIR``, else ``records`` beside the server's log directory
    (``$LOG_LOCATION``), else ``./records``.
    """
    given = os.environ.get(SPOOL_DIR_ENV, "").strip()
    if given:
        return given
    logs = os.environ.get("LOG_LOCATION", "").strip()
    return os.path.join(os.path.dirname(os.path.abspath(logs)), "records") if logs else "records"


def spool_bytes() -> int:
    """The spool's byte budget: ``$RTSERVE_SPOOL_BYTES``, else :data:`DEFAULT_SPOOL_BYTES`.

    Raises:
        ConfigError: the variable is not a positive integer.
    """
    text = os.environ.get(SPOOL_BYTES_ENV, "").strip()
    if not text:
        return DEFAULT_SPOOL_BYTES
    if not text.isdigit() or int(text) <= 0:
        raise ConfigError(f"{SPOOL_BYTES_ENV} must be a positive number of bytes, got {text!r}")
    return int(text)


def segment_bytes(budget: int) -> int:
    """Where a segment rolls over for a spool of ``budget`` bytes."""
    return max(MIN_SEGMENT_BYTES, min(MAX_SEGMENT_BYTES, budget // 16))


def usage(directory: str) -> int:
    """Bytes of the regular files in ``directory`` (0 when it is missing)."""
    total = 0
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                try:
                    if entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
                except FileNotFoundError:  # deleted by the shipper meanwhile
                    continue
    except FileNotFoundError:
        return 0
    return total


class Spool:
    """One worker's writer into the spool directory.

    Each batch's lines go in one ``write``, before its answers, to a segment of this worker's own
    (``<creation ns>-<pid>.jsonl``: created under a dot name, locked, then renamed). The writer holds
    an exclusive ``flock`` on its segment while it may append, so a segment nobody holds is closed for
    good and the shipper may delete it once shipped. Within 1/:data:`NEAR_SHARE` of the budget (while
    :data:`NEAR_MARK` exists) a batch measures and writes under the directory's ``flock``; a batch
    that does not fit is not written (docs/records.md, "The spool").

    Args:
        directory: the spool directory (created when missing).
        budget: the directory's byte budget, all writers and the shipper's files together.
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(self, directory: str, budget: int, clock: Callable[[], float] = time.monotonic) -> None:
        os.makedirs(directory, exist_ok=True)
        self.directory = directory
        self.budget = budget
        self.segment_bytes = segment_bytes(budget)
        self.measure_bytes = max(4096, budget // MEASURE_SHARE)
        self.near = budget - max(budget // NEAR_SHARE, 4 * self.measure_bytes)
        self._mark = os.path.join(directory, NEAR_MARK)
        self._clock = clock
        self._fd = -1
        self._size = 0  # of the open segment
        self._used = 0  # the directory's bytes when last measured, plus what this writer wrote since
        self._since = 0  # bytes written since the last measure
        self._measured = float("-inf")
        self.full = False

    def _open(self) -> None:
        name = f"{time.time_ns():020d}-{os.getpid()}{SEGMENT_SUFFIX}"
        hidden = os.path.join(self.directory, "." + name)
        fd = os.open(hidden, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o640)
        fcntl.flock(fd, fcntl.LOCK_EX)  # held until the segment is closed (or the worker dies)
        os.rename(hidden, os.path.join(self.directory, name))
        self._fd, self._size = fd, 0

    def _close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # releases the lock: the segment is closed for good
            self._fd = -1

    def _measure(self, now: float) -> None:
        self._used = usage(self.directory)
        self._since = 0
        self._measured = now

    def room_for(self, n: int) -> bool:
        """Whether ``n`` more bytes fit in the budget (measuring again when due)."""
        now = self._clock()
        wait = FULL_RECHECK_SECONDS if self.full else MEASURE_SECONDS
        if (
            now - self._measured >= wait
            or self._since >= self.measure_bytes
            or (self._used + n > self.budget and not self.full)
        ):
            self._measure(now)
        self.full = self._used + n > self.budget
        return not self.full

    def append(self, data: bytes) -> bool:
        """Append whole lines with one write; False when they do not fit (nothing written).

        Raises:
            OSError: the directory cannot be written.
        """
        if not data:
            return True
        if self._used + len(data) <= self.near and not os.path.exists(self._mark):
            if not self.room_for(len(data)):
                return False
            if self._used + len(data) <= self.near:  # still, if it measured
                self._write(data)
                return True
        # near the budget: measure and write under the directory's lock (every writer's latest
        # bytes count)
        lock = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.full and self._clock() - self._measured < FULL_RECHECK_SECONDS:
                return False
            self._measure(self._clock())
            if self._used + len(data) > self.near:
                if not os.path.exists(self._mark):
                    os.close(os.open(self._mark, os.O_WRONLY | os.O_CREAT, 0o640))
            elif os.path.exists(self._mark):
                os.unlink(self._mark)
            self.full = self._used + len(data) > self.budget
            if self.full:
                return False
            self._write(data)
            return True
        finally:
            os.close(lock)  # releases the lock

    def _write(self, data: bytes) -> None:
        if self._fd < 0:
            self._open()
        os.write(self._fd, data)
        self._size += len(data)
        self._used += len(data)
        self._since += len(data)
        if self._size >= self.segment_bytes:
            self._close()

    def close(self) -> None:
        """Close the open segment."""
        self._close()


def _js(value: str) -> str:
    """A JSON string literal (plain ASCII ids, as TorchServe's UUIDs, skip the encoder)."""
    if value.isascii() and value.isprintable() and '"' not in value and "\\" not in value:
        return f'"{value}"'
    return json.dumps(value)


def iso_time(seconds: float) -> str:
    """``seconds`` since the epoch as a record's time: UTC, milliseconds, ``Z``."""
    whole = int(seconds)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{int((seconds - whole) * 1000):03d}Z"


#: Compact JSON (an encoder built once: ``json.dumps`` with separators builds one per call).
_compact = json.JSONEncoder(separators=(",", ":")).encode


def rejected_inputs(row: Any) -> str:
    """What a rejected request sent, for its record, as JSON text.

    Its decoded JSON body, or its text, cut to :data:`REJECTED_INPUT_CHARS` characters (then as a
    JSON string).
    """
    body = row.get("data") if isinstance(row, dict) else None
    if body is None and isinstance(row, dict):
        body = row.get("body")
    if isinstance(body, (bytes, bytearray)):
        body = bytes(body[: REJECTED_INPUT_CHARS * 4]).decode("utf-8", "replace")
    if isinstance(body, str):
        return _js(body[:REJECTED_INPUT_CHARS])
    try:
        text = json.dumps(body, separators=(",", ":"), allow_nan=True, default=repr)
    except (ValueError, RecursionError):
        text = json.dumps(repr(body)[:REJECTED_INPUT_CHARS])
    return text if len(text) <= REJECTED_INPUT_CHARS else _js(text[:REJECTED_INPUT_CHARS])


def _plain_batch(batch: Any, answers: Sequence[Any], request_ids: Sequence[str], routes: Sequence[str]) -> bool:
    """Whether ``batch`` is the common batch that :meth:`Recorder._plain_lines` formats.

    Every request is a plain prediction of one row (row ``i`` is request ``i``: no errors,
    explanations or protocol requests), with its answer, its route and a request id that is a plain
    JSON string (TorchServe's UUIDs).
    """
    size = batch.size
    if (
        batch.errors
        or batch.explanations
        or batch.protocols
        or batch.classes is None
        or len(batch.classes) != size
        or len(answers) < size
        or len(routes) < size
        or len(request_ids) < size
        or not all(request_ids)
        or batch.rows != list(range(size))
    ):
        return False
    ids = "".join(request_ids)
    return ids.isascii() and ids.isprintable() and '"' not in ids and "\\" not in ids


class Recorder:
    """Formats a batch's records and appends them to the :class:`Spool` in one write.

    Args:
        spool: the worker's spool writer.
        model, version: the record's ``model`` and ``model_version``.
        labels: class labels (``label`` of each class).
        inputs: keep each request's inputs.
        kind: the model's output kind (``handler.model.KINDS``). A classifier's record names the
            class and label beside the answer; another kind's names the kind (``"kind":
            "regression"``), and its answer (the output's values) is the answer as sent.
    """

    def __init__(
        self,
        spool: Spool,
        model: str,
        version: str,
        labels: Sequence[str],
        inputs: bool = True,
        kind: str = "classification",
    ) -> None:
        self.spool = spool
        self.labels = list(labels)
        #: None for a classifier; else what each prediction record says in place of class and label.
        self._kind = None if kind == "classification" else f'"kind":{_js(kind)}'
        self.inputs = inputs
        self.batches = 0
        self.dropped = 0
        self._dropped_logged = 0
        self._drop_logged_at = float("-inf")
        self._ids = f',"model":{_js(model)},"model_version":{_js(version)},"route":"'
        self._batch = f'"batch":"{os.getpid()}-'
        self._answer = [f'"class":{cls},"label":{_js(label)}' for cls, label in enumerate(labels)]
        self._answer_key = [f'{found},"answer":' for found in self._answer]
        self._second, self._second_text = -1, ""

    def _time(self, seconds: float) -> str:
        """:func:`iso_time`, its date and time of day formatted once a second."""
        whole = int(seconds)
        if whole != self._second:
            self._second_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
            self._second = whole
        return f"{self._second_text}.{int((seconds - whole) * 1000):03d}Z"

    def lines(
        self,
        batch: Any,
        data: Sequence[Any],
        answers: Sequence[Any],
        request_ids: Sequence[str],
        routes: Sequence[str],
        seconds: float,
        now: float | None = None,
    ) -> list[str]:
        """One line per request of ``batch`` (a ``handler.schema.ParsedBatch``) answered or rejected.

        ``answers`` are what the handler returns (text or bytes).
        """
        self.batches += 1
        stamp = self._time(time.time() if now is None else now)
        common = f'{self._batch}{self.batches}","batch_size":{batch.size},"handler_ms":{round(seconds * 1000.0, 3)}'
        if _plain_batch(batch, answers, request_ids, routes):
            return self._plain_lines(batch, answers, request_ids, routes, stamp, common)
        rows_of: dict[int, list[int]] = {}
        for row, idx in enumerate(batch.rows):
            rows_of.setdefault(idx, []).append(row)
        classes = batch.classes or []
        kind = self._kind
        if kind is not None and batch.inputs is not None:  # not a classifier: every row was answered
            classes = [0] * len(batch.rows)
        raw, width = b"", 0
        if self.inputs and batch.inputs is not None:  # every row's float32 bytes, once a batch
            values = batch.inputs.numpy()
            raw, width = values.astype("<f4", copy=False).tobytes(), 4 * values.shape[1]
        errors, explanations, ids, labels = batch.errors, batch.explanations, self._ids, self.labels
        out = []
        for idx in range(batch.size):
            rid = request_ids[idx] if idx < len(request_ids) and request_ids[idx] else None
            head = (
                f'{{"request_id":{_js(rid) if rid is not None else "null"},"time":"{stamp}"'
                f'{ids}{routes[idx] if idx < len(routes) else "unknown"}","status":'
            )
            answer = answers[idx] if idx < len(answers) else None
            answer = answer if isinstance(answer, str) and answer else "null"
            error = errors.get(idx)
            if error is not None:
                reason = getattr(error, "reason", None) or type(error).__name__
                tail = f',"answer":{answer}'
                if self.inputs:
                    tail += f',"inputs":{rejected_inputs(data[idx]) if idx < len(data) else "null"}'
                out.append(f'{head}{error.status},"event":"rejected",{common},"reason":{_js(reason)}{tail}}}\n')
                continue
            rows = rows_of.get(idx)
            if not rows or len(classes) <= rows[-1]:
                continue  # neither answered nor rejected by the handler: nothing to record
            event = "explanation" if idx in explanations else "prediction"
            if kind is not None:
                found = kind
            elif len(rows) == 1:
                found = self._answer[classes[rows[0]]]
            else:
                found = (
                    f'"classes":{_compact([classes[r] for r in rows])},'
                    f'"labels":{_compact([labels[classes[r]] for r in rows])}'
                )
            tail = f',"answer":{answer}'
            if width:
                # a request's rows are consecutive
                encoded = b2a_base64(raw[rows[0] * width : (rows[-1] + 1) * width], newline=False)
                shape = (
                    f"[{width // 4}]"
                    if len(rows) == 1 and idx not in batch.protocols
                    else f"[{len(rows)},{width // 4}]"
                )
                tail += f',"inputs":{{"f32":"{encoded.decode()}","shape":{shape}}}'
            elif self.inputs:
                tail += ',"inputs":null'
            out.append(f'{head}200,"event":"{event}",{common},{found}{tail}}}\n')
        return out

    def _plain_lines(
        self,
        batch: Any,
        answers: Sequence[Any],
        request_ids: Sequence[str],
        routes: Sequence[str],
        stamp: str,
        common: str,
    ) -> list[str]:
        """:meth:`lines` for a batch of plain predictions (see :func:`_plain_batch`).

        Byte for byte what the general loop writes, with one f-string a request.
        """
        size = batch.size
        middle = f'","time":"{stamp}"{self._ids}'
        status = f'","status":200,"event":"prediction",{common},'
        if self.inputs:
            values = batch.inputs.numpy()
            raw, width = values.astype("<f4", copy=False).tobytes(), 4 * values.shape[1]
            shape = f'","shape":[{values.shape[1]}]}}}}\n'
            tails = [
                f',"inputs":{{"f32":"{b2a_base64(raw[at : at + width], newline=False).decode()}{shape}'
                for at in range(0, size * width, width)
            ]
        else:
            tails = ["}\n"] * size
        found = self._answer_key
        return [
            f'{{"request_id":"{rid}{middle}{route}{status}{found[cls]}'
            f"{answer if type(answer) is str and answer else 'null'}{tail}"
            for rid, route, cls, answer, tail in zip(request_ids, routes, batch.classes, answers, tails)
        ]

    def write(self, lines: list[str]) -> bool:
        """Append the lines; False when the spool has no room for them.

        Dropped lines are counted in :attr:`dropped` and said in the log at most every
        :data:`DROP_LOG_SECONDS`.

        Raises:
            OSError: the spool cannot be written.
        """
        if self.spool.append("".join(lines).encode()):
            return True
        self.dropped += len(lines)
        now = time.monotonic()
        if now - self._drop_logged_at >= DROP_LOG_SECONDS:
            logger.warning(
                "records spool %s is full (budget %d bytes): dropped %d record(s) in the last %.0f s, %d since start",
                self.spool.directory,
                self.spool.budget,
                self.dropped - self._dropped_logged,
                min(now - self._drop_logged_at, 1e9),
                self.dropped,
            )
            self._drop_logged_at, self._dropped_logged = now, self.dropped
        return False

    def close(self) -> None:
        self.spool.close()
