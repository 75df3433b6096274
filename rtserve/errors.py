"""rtserve's errors: one root, :class:`RtserveError`, that every rtserve exception derives from.

The command line catches the root once (``error: <message>`` on stderr, exit :data:`EXIT_ERROR`). None becomes an
HTTP answer, so they carry no HTTP status, except :class:`TorchServeError`: the status of the answer that raised it
(0 when none came). The handler's errors have a root of their own (``handler/errors.py``); docs/api.md has the table.
"""

from __future__ import annotations

from typing import Any, TypeVar

E = TypeVar("E", bound="RtserveError")

#: ``python -m rtserve``'s exit status after an :class:`RtserveError` (any of them).
EXIT_ERROR = 1


class RtserveError(Exception):
    """The root of rtserve's errors: the command line exits :data:`EXIT_ERROR` on any of them."""

    def reworded(self: E, message: str) -> E:
        """This error with another message, everything else it carries kept.

        An answer's ``status`` and ``body``, a gate's ``report``: for adding context before raising it again.
        """
        new = self.__class__.__new__(self.__class__)
        new.__dict__.update(self.__dict__)
        new.args = (message,)
        return new


class SettingsError(RtserveError):
    """An ``RTSERVE_*`` variable or a path setting cannot be used (the message names it)."""


class DiskBudgetError(SettingsError):
    """The disk budget is not a size, or is too small for the server's files.

    The message names the setting (``rtserve_disk_budget`` or ``RTSERVE_RUN_VOLUME_LIMIT``).
    """


class ProcessError(RtserveError):
    """A process could not be started, or ran past its time (the message holds the command)."""


class CommandError(ProcessError):
    """A command failed; it keeps the command, its exit status and its output.

    The message ends with the output's last 4000 characters.
    """

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

    def __init__(
        self, message: str, status: int = 0, body: Any = None, reason: str | None = None, expected: int | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = body
        self.reason = reason
        self.expected = expected


class AuthError(TorchServeError):
    """The token was missing, wrong or expired (TorchServe answers 400 InvalidKeyException)."""


class NotFound(TorchServeError):
    """TorchServe answered 404: unknown model or version."""


class Conflict(TorchServeError):
    """TorchServe answered 409: e.g. the version is already registered."""


class Refused(TorchServeError):
    """TorchServe answered 403 or 405: it refuses the operation.

    For example, removing the default version, or the model API is disabled.
    """


class Overloaded(TorchServeError):
    """TorchServe answered 503.

    Its job queue is full (it refused at once), or an explanation went past the handler's per-batch ceiling: retry
    later or elsewhere.
    """


class StubError(RtserveError):
    """The TorchServe jar is missing or lacks a ``.proto`` file, or ``protoc`` failed to compile them."""


# -- one TorchServe instance (rtserve.server) -----------------------------------------------------
class ServerError(RtserveError):
    """TorchServe did not start, died, or did not become ready in time."""


class PortInUseError(ServerError):
    """TorchServe exited during start-up because a listener's port was taken by the time it bound it.

    ``address`` is as it printed it, with its ``port``: a start on other ports can succeed.
    """

    def __init__(self, message: str, address: str, port: int | None) -> None:
        super().__init__(message)
        self.address, self.port = address, port


class WarmupError(RtserveError):
    """The start-up warm-up's settings are invalid, or the server answered a warm-up request wrongly."""


class WrongAnswers(WarmupError):
    """The served model answers its archive's golden rows differently (a bad build or export).

    Trying again cannot help, so a container running it exits.
    """


# -- models and archives (rtserve.model) ----------------------------------------------------------
class PackagingError(RtserveError):
    """The model or its data cannot be packaged; the message says what to fix."""


class ArchiveError(RtserveError):
    """A model archive cannot be read, or lacks its manifest, ``meta.json`` or what the caller needs from it.

    The message names the file.
    """


# -- versions (rtserve.promotion) -----------------------------------------------------------------
class GateError(RtserveError):
    """The gate could not run or its check failed.

    A bad thresholds file, an unreadable requests file, a p99 over its limit.
    """


class GoldenMismatch(GateError):
    """A version's live answers differ from its archive's golden set."""


class RolloutError(RtserveError):
    """A version operation was refused before anything changed (bad version, no history, already the default, ...)."""


class GateRefused(RolloutError):
    """The promotion gate refused the candidate.

    ``report`` (a :class:`rtserve.promotion.gate.GateReport`) holds its figures.
    """

    def __init__(self, report: Any) -> None:
        super().__init__(
            f"{report.text()}\n{report.model} {report.candidate} was not promoted; "
            'nothing changed (FORCE=1 REASON="..." overrides)'
        )
        self.report = report


class LiveError(RtserveError):
    """A shadow or canary was refused before anything changed, or the routes file or live log cannot be read.

    Refused: the candidate is not registered, has no ready worker or is the default; a bad share; another canary's
    watcher runs. An unreadable file is named in the message.
    """


# -- the pod's gateway, monitoring, the cluster ---------------------------------------------------
class GatewayError(RtserveError):
    """The shared-token file or the pod's key file cannot be used (the message says why)."""


class MonitorError(RtserveError):
    """Prometheus or Alertmanager cannot be configured, started or stopped."""


class ClusterError(RtserveError):
    """The local cluster cannot be built, configured, started or stopped."""


class ImageNotFound(ClusterError):
    """An image to load into the local cluster's node is not in the engine's store.

    It is not built yet, or is known there only by another name.
    """


class RecordsError(RtserveError):
    """A request's record is malformed, or the records' spool cannot be read or written.

    The message names the file or the line.
    """


class StoreUnavailable(RecordsError):
    """The records store (Apache Cassandra) cannot be reached or refused a write.

    The records stay in the spool and are sent again.
    """


class StoreSchemaError(RecordsError):
    """The records store's tables are missing, or its schema is newer than this rtserve knows.

    ``found`` and ``known`` are the versions; nothing was written.
    """

    def __init__(self, message: str, found: int, known: int) -> None:
        super().__init__(message)
        self.found = found
        self.known = known


class StoreError(RecordsError):
    """The records store refused a statement as invalid.

    Not a passing failure: the same call would fail again; the message holds Cassandra's reason.
    """


class CassandraNodeError(RecordsError):
    """The local Cassandra node cannot be started or stopped (the message says which, with the end of its log)."""


class StreamError(RtserveError):
    """The local Kafka broker cannot be assembled, started, reached or stopped.

    The message says which, with the end of its log.
    """


class DeployError(RtserveError):
    """A cluster deployment or its verification failed (the message says which step)."""
