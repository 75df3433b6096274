"""The transaction bench's own parts: what it counts as a refusal, its percentiles and its arguments."""

from __future__ import annotations

import logging

import pytest

from bench.stream_txn import Refusals, main, percentile


def test_only_concurrent_transactions_refusals_are_counted():
    refusals = Refusals()
    log = logging.getLogger("test.refusals")
    log.addHandler(refusals)
    log.setLevel(logging.DEBUG)
    log.debug(
        'TxnCoordinator/1: AddPartitionsToTxn response: partition "p": [0]: Broker: Producer attempted to '
        "update a transaction while another concurrent operation on the same transaction was ongoing"
    )
    log.debug('TxnCoordinator/1: AddPartitionsToTxn response: partition "p": [0]: Success')
    assert refusals.count == 1


def test_percentiles_of_the_transactions_times():
    times = [float(x) for x in range(1, 101)]
    assert (percentile(times, 50), percentile(times, 99), percentile([3.0], 99)) == (51.0, 100.0, 3.0)


@pytest.mark.parametrize(
    "args", [["--pauses", "-1"], ["--pauses", ""], ["--transactions", "5"], ["--outputs", "0"], ["--rounds", "0"]]
)
def test_bad_arguments_are_refused_before_a_broker_starts(args, tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--kafka-libs", str(tmp_path), "--run-root", str(tmp_path), *args])
    assert exited.value.code == 2 and "--pauses must be" in capsys.readouterr().err
    assert not (tmp_path / "bench-stream").exists()
