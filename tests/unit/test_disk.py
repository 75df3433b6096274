"""The disk budget (rtserve.server.disk): one total, from config.properties or the pod's run volume,
split into shares that never add up to more; what the server hands each process from it."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
import zipfile

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from rtserve.errors import DiskBudgetError, SettingsError
from rtserve.server import disk
from rtserve.server.disk import (
    BUDGET_KEY,
    CONSOLE_ENV,
    DEFAULT_BUDGET,
    LOG_FILE_ENV,
    MIN_TOTAL,
    OUTPUT_FILES,
    SPOOL_ENV,
    TS_LOGS,
    DiskBudget,
    audit_cap,
    recorded,
)
from rtserve.server.properties import read_properties, write_properties
from rtserve.server.torchserve import EXPORTER, OIP_ROUTES, SHIPPER, SIDECARS, TorchServe
from rtserve.settings import PACKAGE_HOME, RunDir, Settings, log_config

pytestmark = pytest.mark.unit

MiB = 2**20


def budget(text: str | None = None, limit: str | None = None) -> DiskBudget:
    env = {"RTSERVE_RUN_VOLUME_LIMIT": limit} if limit else {}
    return DiskBudget.resolve({} if text is None else {BUDGET_KEY: text}, Settings.from_env(env))


@pytest.mark.parametrize(
    "text, size",
    [
        ("512MB", 512 * 10**6),
        ("512mb", 512 * 10**6),
        ("8MiB", 8 * MiB),
        ("8 MiB", 8 * MiB),
        ("1.5GiB", 3 * 2**29),
        ("2GB", 2 * 10**9),
        ("10000KB", 10**7),
        ("9000KiB", 9000 * 1024),
        ("16777216", 16 * MiB),
        ("16777216B", 16 * MiB),
    ],
)
def test_the_config_value_takes_decimal_and_binary_units(text, size):
    assert budget(text).total == size


@pytest.mark.parametrize("text", ["", "big", "512 XB", "-8MiB", "8Mi", "MiB", "0"])
def test_a_config_value_that_is_not_a_size_is_refused_naming_the_key(text):
    with pytest.raises(DiskBudgetError, match=rf"^{BUDGET_KEY}: '{re.escape(text)}' is not a size in bytes"):
        budget(text)


@pytest.mark.parametrize(
    "limit, total", [("48Mi", 24 * MiB), ("1Gi", 512 * MiB), ("100M", 50 * 10**6), ("1.5Gi", 768 * MiB)]
)
def test_in_a_pod_the_budget_is_half_the_run_volumes_limit_whatever_the_config_says(limit, total):
    found = budget("1GB", limit=limit)
    assert found.total == total
    assert found.source.startswith("RTSERVE_RUN_VOLUME_LIMIT")


def test_a_volume_limit_that_is_not_a_quantity_is_refused_naming_the_variable():
    with pytest.raises(SettingsError, match=r"^RTSERVE_RUN_VOLUME_LIMIT: '1 gigabyte' is not a size"):
        Settings.from_env({"RTSERVE_RUN_VOLUME_LIMIT": "1 gigabyte"})
    with pytest.raises(
        SettingsError,
        match="RTSERVE_RUN_VOLUME_LIMIT: '1GiB' is not a size in bytes: "
        "a positive number, then nothing .bytes. or one of k, M, G, T, Ki",
    ):
        Settings.from_env({"RTSERVE_RUN_VOLUME_LIMIT": "1GiB"})  # a quantity says Gi
    assert Settings.from_env({"RTSERVE_RUN_VOLUME_LIMIT": " "}).run_volume_limit is None


def test_too_small_a_budget_is_refused_saying_what_it_needs():
    with pytest.raises(
        DiskBudgetError,
        match=rf"^{BUDGET_KEY}: a disk budget of 7.0 MiB is too small: "
        r"the server's files need at least 8.0 MiB",
    ):
        budget("7MiB")
    with pytest.raises(
        DiskBudgetError,
        match=r"^RTSERVE_RUN_VOLUME_LIMIT \(half the run volume's 8.0 MiB\): "
        r"a disk budget of 4.0 MiB is too small",
    ):
        budget(limit="8Mi")
    assert budget(limit="16Mi").total == MIN_TOTAL == budget("8MiB").total


def check_shares(total: int) -> None:
    shares = DiskBudget(total).shares()
    assert shares.total <= total
    assert total - shares.total < 256 + len(TS_LOGS) + len(OUTPUT_FILES)  # only rounding is left over
    assert all(value > 0 for value in vars(shares).values()), shares
    assert 0.49 < shares.spool / total <= 0.5  # about half for the records spool
    assert shares.ts_log_roll > 0 and 2 * (shares.ts_log_roll + disk.LINE_MARGIN) <= shares.ts_log_file


@pytest.mark.parametrize(
    "total", [MIN_TOTAL, MIN_TOTAL + 1, 24 * MiB, 48 * MiB, 48 * MiB - 1, 512 * 10**6, 512 * MiB, 10**9 + 7, 64 * 2**30]
)
def test_the_shares_never_add_up_to_more_than_the_total(total):
    check_shares(total)


@hsettings(max_examples=500, deadline=None)
@given(st.integers(min_value=MIN_TOTAL, max_value=2**44))
def test_the_shares_never_add_up_to_more_than_any_total(total):
    check_shares(total)


def test_at_the_least_budget_each_file_still_has_room():
    shares = DiskBudget(MIN_TOTAL).shares()
    assert shares.output_file >= 32 * 1024 and shares.ts_log_roll >= 160 * 1024
    assert shares.live_log >= 256 * 1024 and shares.audit_log >= 64 * 1024
    assert shares.tmp >= 2 * 420_000  # the demo archive unpacks to about 420 kB: two versions fit


def test_the_checkouts_config_and_the_log_configs_default_are_the_default_budget():
    """One place: the code's default is the checkout's value, and log4j2.xml's fallback (without
    rtserve's server) is that budget's roll size."""
    props = read_properties(PACKAGE_HOME / "config.properties")
    assert budget(props[BUDGET_KEY]).total == DEFAULT_BUDGET == budget(None).total
    fallback = re.search(r"\$\{env:" + LOG_FILE_ENV + r":-(\d+)\}", log_config().read_text())
    assert fallback and int(fallback.group(1)) == DiskBudget(DEFAULT_BUDGET).shares().ts_log_roll


def test_every_torchserve_log_rolls_by_size_only_to_one_uncompressed_backup():
    root = ET.parse(log_config()).getroot()
    rolling = root.findall("./Appenders/RollingFile")
    names = sorted(f.get("fileName").rsplit("/", 1)[1] for f in rolling)
    assert names == sorted(TS_LOGS)
    for appender in rolling:
        file = appender.get("fileName")
        assert appender.get("filePattern") == f"{file}.%i", file
        policies = appender.find("Policies")
        assert [p.tag for p in policies] == ["SizeBasedTriggeringPolicy"], file
        assert policies[0].get("size") == "${roll}"
        strategy = appender.find("DefaultRolloverStrategy")
        assert (strategy.get("min"), strategy.get("max")) == ("1", "1"), file
    # every file still goes through an asynchronous appender
    assert sorted(a.find("AppenderRef").get("ref") for a in root.findall("./Appenders/Async")) == sorted(
        a.get("name") for a in rolling
    )


def test_the_output_files_are_the_launchers_the_sidecars_and_the_canary_watchers(tmp_path):
    server = TorchServe(tmp_path / "run", tmp_path / "store")
    expected = {server.run_dir / "launcher.log", server.files.canary_log.resolve()}
    expected |= {s.log(server.files) for s in SIDECARS}
    assert set(server.output_files) == expected and len(OUTPUT_FILES) == len(expected)
    assert {EXPORTER, OIP_ROUTES, SHIPPER} == set(SIDECARS)


def test_the_server_hands_the_shares_to_torchserve_the_agent_and_the_exporter(tmp_path, monkeypatch):
    server = TorchServe(tmp_path / "run", tmp_path / "store", overrides={BUDGET_KEY: "48MiB"})
    shares = server.budget.shares()
    env = server._env("key")
    assert (env[LOG_FILE_ENV], env[SPOOL_ENV], env[CONSOLE_ENV]) == (str(shares.ts_log_roll), str(shares.spool), "OFF")
    assert server._env("key", console=True)[CONSOLE_ENV] == "INFO"
    effective = server.effective_props(41234, 41236)
    assert effective[BUDGET_KEY] == str(48 * MiB)
    assert effective["vmargs"].endswith(f",live-log-bytes={shares.live_log}")
    args = EXPORTER.args(server, effective)
    assert args[args.index("--output-bytes") + 1] == str(shares.output_file)
    assert args[args.index("--outputs") + 1 :] == [str(p) for p in server.output_files]
    # a later command on the run directory reads the same budget back
    RunDir(server.run_dir).path.mkdir(parents=True)
    write_properties(server.files.config, effective)
    assert recorded(server.run_dir).total == 48 * MiB
    assert audit_cap(server.run_dir) == shares.audit_log
    assert audit_cap(tmp_path / "nothing-started-here") == DiskBudget(DEFAULT_BUDGET).shares().audit_log
    monkeypatch.setenv("RTSERVE_RUN_VOLUME_LIMIT", "64Mi")  # the pod's volume wins
    pod = TorchServe(
        tmp_path / "run", tmp_path / "store", overrides={BUDGET_KEY: "48MiB"}, settings=Settings.from_env()
    )
    assert pod.budget.total == 32 * MiB


def test_archives_that_unpack_beyond_the_tmp_reserve_are_refused_before_the_start(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    with zipfile.ZipFile(store / "big_1.0.mar", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("model.pt2", b"\0" * 2 * MiB)
    server = TorchServe(tmp_path / "run", store, ["big=big_1.0.mar"], overrides={BUDGET_KEY: "8MiB"})
    with pytest.raises(
        DiskBudgetError,
        match=r"the archives loaded at start unpack to 2.0 MiB, more than "
        r"the 0.9 MiB the budget of 8.0 MiB keeps for TorchServe's tmp",
    ):
        server.start()
    assert not (tmp_path / "run" / "config.properties").exists()
    server.overrides[BUDGET_KEY] = "32MiB"
    server.budget.check_tmp([store / "big_1.0.mar"])  # fits a larger budget


def test_the_disk_tests_sampler_counts_rollovers_that_reuse_an_inode(tmp_path):
    """tests/disk_budget.py's sampler: a rollover's new file often gets the inode number the
    deleted backup just freed (two inodes take turns), so a set of inodes saw one rollover for
    many; it counts each change of inode or shrink between samples."""
    from tests.disk_budget import Usage

    log = tmp_path / "logs" / "model_log.log"
    log.parent.mkdir()
    log.write_text("x" * 100)
    usage = Usage(tmp_path)
    usage.sample()
    for _ in range(5):
        log.with_name("model_log.log.1").unlink(missing_ok=True)
        log.rename(log.with_name("model_log.log.1"))
        log.write_text("y" * 10)
        usage.sample()
    assert usage.rolls("model_log.log") == 5
