"""The server's disk budget: one total in bytes, set in one place, split into a cap per file it writes.

The total is ``rtserve_disk_budget``, or half the run volume's limit (``RTSERVE_RUN_VOLUME_LIMIT``) so that the kubelet
never evicts the pod; :meth:`DiskBudget.shares` splits it among the logs, output files, records spool and reserves.
The resolved total is recorded in the effective config, so later commands on the run directory find the same caps
(:func:`recorded`).
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rtserve.errors import DiskBudgetError, SettingsError
from rtserve.server.properties import read_properties
from rtserve.settings import TORCHSERVE_LOGS, RunDir, Settings, byte_size

#: The config.properties key of the total.
BUDGET_KEY = "rtserve_disk_budget"
#: The pod's override (a Kubernetes quantity; the budget is half of it).
VOLUME_ENV = "RTSERVE_RUN_VOLUME_LIMIT"
#: The total when config.properties has no BUDGET_KEY (the checkout's file sets the same).
DEFAULT_BUDGET = 512 * 10**6
#: config.properties' units: powers of 1000 (KB, MB, GB) and of 1024 (KiB, MiB, GiB), any case.
CONFIG_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
#: The least total the server's files fit in: each output file then has 32 KiB (with its
#: backup), each of TorchServe's log files rolls at 160 KiB, the tmp reserve holds 896 KiB.
MIN_TOTAL = 8 * 2**20

#: What the server sets in TorchServe's environment (the workers inherit it): each TorchServe log
#: file's roll size (log4j2.xml's ``${env:RTSERVE_LOG_FILE_BYTES}``), the records spool's share.
LOG_FILE_ENV = "RTSERVE_LOG_FILE_BYTES"
SPOOL_ENV = "RTSERVE_SPOOL_BYTES"
#: The server sends TorchServe's ts_log to the console too (its per-batch lines left out) when
#: this is ``INFO`` (the foreground server, a pod's main process); ``OFF`` otherwise.
CONSOLE_ENV = "RTSERVE_TS_CONSOLE_LEVEL"

#: TorchServe's log files (rtserve/server/log4j2.xml), each with one backup ``NAME.1``.
TS_LOGS = TORCHSERVE_LOGS
#: log4j2 rolls a file once it has passed its size, so a file holds up to one line more than that:
#: the roll size leaves this much for the longest line.
LINE_MARGIN = 16 * 2**10

#: Each share in 256ths of the total (they add up to 256).
WEIGHTS = {
    "spool": 128,
    "tmp": 28,
    "ts_log_file": 11 * len(TS_LOGS),
    "live_log": 12,
    "metrics": 20,
    "audit_log": 4,
    "output_files": 5,
    "state": 4,
}
#: The output files the exporter copy-truncates (:attr:`Shares.output_file` each), relative to
#: the run directory: the launcher's, the three sidecars' and the canary watcher's.
OUTPUT_FILES = tuple(str(path) for path in RunDir(Path()).output_files)


@dataclass(frozen=True)
class Shares:
    """The budget split: bytes each file (with its one backup) or reserve may take.

    Attributes:
        ts_log_file: each of TorchServe's :data:`TS_LOGS`.
        live_log: the agent's live log; audit_log: the audit log (events).
        output_file: each of :data:`OUTPUT_FILES`.
        spool: the records spool (``RUN_DIR/records/``).
        tmp: TorchServe's tmp (the unpacked archives).
        metrics: the workers' metrics files, when they live in the run directory.
        state: the small files (configs, keys, PID files, markers, history, reports).
    """

    ts_log_file: int
    live_log: int
    audit_log: int
    output_file: int
    spool: int
    tmp: int
    metrics: int
    state: int

    @property
    def total(self) -> int:
        """What all shares add up to (never more than the budget)."""
        return (
            self.ts_log_file * len(TS_LOGS)
            + self.live_log
            + self.audit_log
            + self.output_file * len(OUTPUT_FILES)
            + self.spool
            + self.tmp
            + self.metrics
            + self.state
        )

    @property
    def ts_log_roll(self) -> int:
        """Where log4j2 rolls each TorchServe log file (half its share, less a line's margin)."""
        return self.ts_log_file // 2 - LINE_MARGIN


@dataclass(frozen=True)
class DiskBudget:
    """The bytes every file the server writes may take together.

    Attributes:
        total: the budget in bytes.
        source: where it was set (for errors and logs).

    Raises:
        DiskBudgetError: ``total`` is below :data:`MIN_TOTAL`.
    """

    total: int
    source: str = BUDGET_KEY

    def __post_init__(self) -> None:
        if self.total < MIN_TOTAL:
            raise DiskBudgetError(
                f"{self.source}: a disk budget of {mib(self.total)} is too small: the server's "
                f"files need at least {mib(MIN_TOTAL)}"
            )

    def shares(self) -> Shares:
        """The split (:data:`WEIGHTS`, rounded down: the sum never exceeds :attr:`total`)."""
        unit = {name: self.total * weight // 256 for name, weight in WEIGHTS.items()}
        return Shares(
            ts_log_file=unit["ts_log_file"] // len(TS_LOGS),
            live_log=unit["live_log"],
            audit_log=unit["audit_log"],
            output_file=unit["output_files"] // len(OUTPUT_FILES),
            spool=unit["spool"],
            tmp=unit["tmp"],
            metrics=unit["metrics"],
            state=unit["state"],
        )

    def env(self) -> dict[str, str]:
        """What TorchServe's environment carries (:data:`LOG_FILE_ENV`, :data:`SPOOL_ENV`)."""
        shares = self.shares()
        return {LOG_FILE_ENV: str(shares.ts_log_roll), SPOOL_ENV: str(shares.spool)}

    @classmethod
    def resolve(cls, props: Mapping[str, str], settings: Settings) -> DiskBudget:
        """The budget of a server with config ``props``.

        Half the run volume's limit when ``settings`` has one, else ``rtserve_disk_budget`` (else
        :data:`DEFAULT_BUDGET`).

        Raises:
            DiskBudgetError: the setting is not a size, or the budget is too small.
        """
        if settings.run_volume_limit is not None:
            return cls(
                settings.run_volume_limit // 2, f"{VOLUME_ENV} (half the run volume's {mib(settings.run_volume_limit)})"
            )
        text = props.get(BUDGET_KEY)
        if text is None:
            return cls(DEFAULT_BUDGET)
        try:
            return cls(byte_size(text, BUDGET_KEY, CONFIG_UNITS, ignore_case=True))
        except SettingsError as exc:
            raise DiskBudgetError(str(exc)) from exc

    def check_tmp(self, archives: list[Path]) -> None:
        """Check that ``archives`` (loaded at start) unpack within the tmp reserve.

        Raises:
            DiskBudgetError: they would not.
        """
        unpacked = sum(unpacked_bytes(a) for a in archives)
        if unpacked > self.shares().tmp:
            raise DiskBudgetError(
                f"{self.source}: the archives loaded at start unpack to {mib(unpacked)}, more than "
                f"the {mib(self.shares().tmp)} the budget of {mib(self.total)} keeps for "
                "TorchServe's tmp: raise the budget"
            )


def recorded(run_dir: Path) -> DiskBudget:
    """The budget the server in ``run_dir`` started with (its effective config records it), else the default.

    The default is for a run directory where no server started.

    Raises:
        DiskBudgetError: the effective config's value is not a size.
    """
    try:
        text = read_properties(RunDir(Path(run_dir)).config).get(BUDGET_KEY)
    except OSError:
        text = None
    return DiskBudget.resolve({} if text is None else {BUDGET_KEY: text}, Settings())


def audit_cap(run_dir: Path | None) -> int:
    """The audit log's cap (with its backup) for the server in ``run_dir``.

    The budget is :func:`recorded`'s; the default budget's for None.
    """
    return (recorded(run_dir) if run_dir is not None else DiskBudget(DEFAULT_BUDGET)).shares().audit_log


def unpacked_bytes(archive: Path) -> int:
    """How many bytes ``archive`` (a .mar, a zip) unpacks to; 0 for anything else."""
    try:
        with zipfile.ZipFile(archive) as z:
            return sum(i.file_size for i in z.infolist())
    except (OSError, zipfile.BadZipFile):
        return 0


def mib(size: int) -> str:
    """``size`` bytes in MiB for messages."""
    return f"{size / 2**20:.1f} MiB"
