"""rtserve's errors: one root, :class:`RtserveError`, that every rtserve exception derives from.

The command line (``python -m rtserve``) catches the root once: it prints ``error: <message>``
and exits 1. Each class names the HTTP status it stands for in ``status`` (as the handler's own
errors do, ``handler/errors.py``); a :class:`TorchServeError` carries the status of the answer
that raised it instead (0 when no answer came).

The handler (``handler/``) is packed into each model archive and runs in TorchServe's workers
without rtserve, so its errors (``handler.errors.HandlerError``) have a root of their own.
"""

from __future__ import annotations

from typing import Any, TypeVar

E = TypeVar("E", bound="RtserveError")


class RtserveError(Exception):
    """The root of rtserve's errors (HTTP 500 unless a subclass says otherwise)."""

    status: int = 500

    def reworded(self: E, message: str) -> E:
        """This error with another message, everything else it carries kept (``status``,
        ``body``, a gate's ``report``): for adding context before raising it again."""
        new = self.__class__.__new__(self.__class__)
        new.__dict__.update(self.__dict__)
        new.args = (message,)
        return new


class SettingsError(RtserveError):
    """HTTP 400: an ``RTSERVE_*`` variable or a path setting cannot be used (the message names it)."""

    status = 400


class DiskBudgetError(SettingsError):
    """HTTP 400: the disk budget (``rtserve_disk_budget``, ``RTSERVE_RUN_VOLUME_LIMIT``) is not a
    size, or is too small for the server's files (the message names the setting)."""


class ProcessError(RtserveError):
    """HTTP 500: a process could not be started, or ran past its time (the message holds the
    command)."""


class CommandError(ProcessError):
    """HTTP 500: a command failed; it keeps the command, its exit status and its output (the
    message ends with the output's last 4000 characters)."""

    def __init__(self, argv: list[str], returncode: int, output: str) -> None:
        self.argv, self.returncode, self.output = argv, returncode, output
        super().__init__(f"{' '.join(argv)} exited with {returncode}:\n{output[-4000:]}")


# -- TorchServe's APIs (rtserve.client) ------------------------------------------------------------
class TorchServeError(RtserveError):
    """An API call failed; ``status`` is the HTTP status of the answer (0 when no answer came).

    A request the handler refused (400) also carries the handler's ``reason`` and, for a list of
    the wrong length, the ``expected`` count (its ``X-Rtserve-Reason`` and
    ``X-Rtserve-Expected-Count`` headers); None otherwise.
    """

    def __init__(self, message: str, status: int = 0, body: Any = None, reason: str | None = None,
                 expected: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body
        self.reason = reason
        self.expected = expected


class AuthError(TorchServeError):
    """The token was missing, wrong or expired (TorchServe answers 400 InvalidKeyException)."""


class NotFound(TorchServeError):
    """HTTP 404: unknown model or version."""


class Conflict(TorchServeError):
    """HTTP 409: e.g. the version is already registered."""


class Refused(TorchServeError):
    """HTTP 403 or 405: the server refuses the operation (e.g. removing the default version,
    or the model API is disabled)."""


class Overloaded(TorchServeError):
    """HTTP 503 from a full job queue (TorchServe refused at once), or an explanation past the
    handler's per-batch ceiling: retry later or elsewhere."""


class StubError(RtserveError):
    """HTTP 500: the TorchServe jar is missing or lacks a ``.proto`` file, or ``protoc`` failed
    to compile them."""


# -- one TorchServe instance (rtserve.server) -----------------------------------------------------
class ServerError(RtserveError):
    """HTTP 503: TorchServe did not start, died, or did not become ready in time."""

    status = 503


class PortInUseError(ServerError):
    """HTTP 503: TorchServe exited during start-up because a listener's port was taken by the time
    it bound it (``address`` as it printed it, ``port``): a start on other ports can succeed."""

    def __init__(self, message: str, address: str, port: int | None) -> None:
        super().__init__(message)
        self.address, self.port = address, port


class WarmupError(RtserveError):
    """HTTP 503: the start-up warm-up's settings are invalid, or the server answered a warm-up
    request wrongly."""

    status = 503


class WrongAnswers(WarmupError):
    """HTTP 500: the served model answers its archive's golden rows differently (a bad build or
    export): trying again cannot help, so a container running it exits."""

    status = 500


# -- models and archives (rtserve.model) ----------------------------------------------------------
class PackagingError(RtserveError):
    """HTTP 400: the model or its data cannot be packaged; the message says what to fix."""

    status = 400


class ArchiveError(RtserveError):
    """HTTP 422: a model archive cannot be read, or lacks its manifest, ``meta.json`` or what
    the caller needs from it (the message names the file)."""

    status = 422


# -- versions (rtserve.promotion) -----------------------------------------------------------------
class GateError(RtserveError):
    """HTTP 422: the gate could not run or its check failed: a bad thresholds file, an
    unreadable requests file, a p99 over its limit."""

    status = 422


class GoldenMismatch(GateError):
    """HTTP 422: a version's live answers differ from its archive's golden set."""


class RolloutError(RtserveError):
    """HTTP 409: a version operation was refused before anything changed (bad version, no
    history, already the default, ...)."""

    status = 409


class GateRefused(RolloutError):
    """HTTP 409: the promotion gate refused the candidate; ``report`` (a
    :class:`rtserve.promotion.gate.GateReport`) holds its figures."""

    def __init__(self, report: Any) -> None:
        super().__init__(f"{report.text()}\n{report.model} {report.candidate} was not promoted; "
                         "nothing changed (FORCE=1 REASON=\"...\" overrides)")
        self.report = report


class LiveError(RtserveError):
    """HTTP 409: a shadow or canary was refused before anything changed (the candidate is not
    registered, has no ready worker or is the default; a bad share; another canary's watcher
    runs), or the routes file or live log cannot be read (the message names the file)."""

    status = 409


# -- the pod's gateway, monitoring, the cluster ---------------------------------------------------
class GatewayError(RtserveError):
    """HTTP 400: the shared-token file or the pod's key file cannot be used (the message says why)."""

    status = 400


class MonitorError(RtserveError):
    """HTTP 503: Prometheus or Alertmanager cannot be configured, started or stopped."""

    status = 503


class ClusterError(RtserveError):
    """HTTP 503: the local cluster cannot be built, configured, started or stopped."""

    status = 503


class ImageNotFound(ClusterError):
    """HTTP 404: an image to load into the local cluster's node is not in the engine's store
    (not built yet), or is known there only by another name."""

    status = 404


class RecordsError(RtserveError):
    """HTTP 500: a request's record is malformed, or the records' spool cannot be read or written
    (the message names the file or the line)."""


class StoreUnavailable(RecordsError):
    """HTTP 503: the records store (Apache Cassandra) cannot be reached or refused a write; the
    records stay in the spool and are sent again."""

    status = 503


class StoreSchemaError(RecordsError):
    """HTTP 500: the records store's tables are missing, or its schema is at a version newer than
    this rtserve knows (``found``, ``known``: the versions); nothing was written."""

    def __init__(self, message: str, found: int, known: int) -> None:
        super().__init__(message)
        self.found = found
        self.known = known


class StoreError(RecordsError):
    """HTTP 500: the records store refused a statement as invalid (not a passing failure: the
    same call would fail again; the message holds Cassandra's reason)."""


class CassandraNodeError(RecordsError):
    """HTTP 503: the local Cassandra node cannot be started or stopped (the message says which,
    with the end of its log)."""

    status = 503


class StreamError(RtserveError):
    """HTTP 503: the local Kafka broker cannot be assembled, started, reached or stopped (the
    message says which, with the end of its log)."""

    status = 503


class DeployError(RtserveError):
    """HTTP 502: a cluster deployment or its verification failed (the message says which step)."""

    status = 502
