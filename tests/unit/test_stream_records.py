"""The stream consumer's pure parts: an event is validated by the handler's own functions (the
dead letter names the field as the HTTP answer would), the records it writes carry the source
coordinates, the offsets it commits and rewinds to, its settings are checked once, and a
background start that fails says why."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Message, TopicPartition

from handler.errors import InvalidInput
from rtserve.errors import StreamError
from rtserve.stream import records
from rtserve.stream.consumer import StreamConfig, first_offsets, next_offsets
from rtserve.stream.records import Source

pytestmark = pytest.mark.unit

SOURCE = Source("events", 2, 41, 1796070000123)


@pytest.mark.parametrize(
    "value, field, reason",
    [
        (None, None, "empty_body"),
        (b"", None, "empty_body"),
        (b"not json", None, "not_json"),
        (b"[1, 2]", "features", "not_an_object"),
        (b'{"id": 7}', "features", "missing_field"),
        (b'{"features": "1,2"}', "features", "not_a_list"),
        (b'{"features": [1, NaN, 3]}', "features[1]", "non_finite"),
        (b'{"features": [1, 1e300]}', "features[1]", "out_of_range"),
        (b'{"features": [1, "2"]}', "features[1]", "not_a_number"),
    ],
)
def test_a_bad_event_is_refused_naming_the_field(value, field, reason):
    with pytest.raises(InvalidInput) as refused:
        records.parse_event(value)
    assert (refused.value.field, refused.value.reason) == (field, reason)
    letter = json.loads(records.refused(SOURCE, refused.value))
    assert letter == {
        "error": refused.value.message,
        "field": field,
        "reason": reason,
        "source": {"topic": "events", "partition": 2, "offset": 41},
        "event_timestamp": 1796070000123,
    }


def test_the_count_is_checked_here_when_known_else_by_the_server():
    assert records.parse_event(b'{"features": [1, 2]}').request == {"features": [1, 2]}
    with pytest.raises(InvalidInput, match=r"^'features' must be a list of numbers, got string$"):
        records.parse_event(b'{"features": "1,2"}')
    with pytest.raises(InvalidInput, match=r"'features' must have exactly 32 numbers, got 2"):
        records.parse_event(b'{"features": [1, 2]}', n_features=32)


def test_a_prediction_keeps_the_answer_the_id_and_the_source():
    event = records.parse_event(b'{"features": [0.5, 1], "id": "order-17", "extra": 1}')
    assert event == records.Event({"features": [0.5, 1]}, "order-17")
    answer = {"prediction": 2, "label": "high", "probabilities": [0.1, 0.2, 0.7], "model_version": "1.0"}
    assert json.loads(records.prediction(SOURCE, event, answer)) == {
        **answer,
        "id": "order-17",
        "source": {"topic": "events", "partition": 2, "offset": 41},
        "event_timestamp": 1796070000123,
    }
    anonymous = records.parse_event(b'{"features": [0.5, 1]}')
    assert "id" not in json.loads(records.prediction(SOURCE, anonymous, answer))


def test_an_oversized_event_is_a_dead_letter_naming_its_size():
    letter = json.loads(records.too_large(SOURCE, 5_000_000, 65536))
    assert letter == {
        "error": "event of 5000000 bytes is larger than 65536 bytes",
        "field": None,
        "reason": "too_large",
        "source": SOURCE.as_dict(),
        "event_timestamp": SOURCE.timestamp,
    }


def test_offsets_committed_after_each_partitions_last_event_and_rewound_to_its_first():
    msgs = [Message(topic="events", partition=p, offset=o) for p, o in ((0, 5), (1, 9), (0, 6), (0, 7), (1, 10))]
    key = lambda tp: (tp.partition, tp.offset)  # noqa: E731
    assert sorted(map(key, next_offsets(msgs))) == [(0, 8), (1, 11)]
    assert sorted(map(key, first_offsets(msgs))) == [(0, 5), (1, 9)]
    assert all(isinstance(tp, TopicPartition) and tp.topic == "events" for tp in next_offsets(msgs))


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"batch": 0}, "stream setting batch must be at least 1, got 0"),
        ({"concurrency": 0}, "stream setting concurrency must be at least 1, got 0"),
        ({"instances": 0}, "stream setting instances must be at least 1, got 0"),
        ({"poll": 0}, "stream setting poll must be positive, got 0"),
        ({"output": "events"}, "the input, output and dead-letter topics must differ"),
        (
            {"max_event_bytes": 0},
            "stream setting max_event_bytes must be within 1..524288 (an output must fit a 1 MB record), got 0",
        ),
        (
            {"max_event_bytes": 600_000},
            "stream setting max_event_bytes must be within 1..524288 (an output must fit a 1 MB record), got 600000",
        ),
    ],
)
def test_bad_settings_are_refused_at_once(bad, message):
    with pytest.raises(StreamError) as refused:
        StreamConfig("127.0.0.1:9092", **bad)
    assert str(refused.value) == message


def test_a_background_consumer_that_cannot_start_says_why(tmp_path, monkeypatch):
    """``make stream``'s start (rtserve.stream.service) from another directory: the consumer's
    own error (a bad option) ends the start with the end of its log; nothing is left running."""
    from rtserve.stream import service

    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        StreamError,
        match=r"(?s)the stream consumer exited with 2 at start; the end of "
        r".*stream.log:\n.*argument --batch: invalid int value: 'x'",
    ):
        service.start(tmp_path / "stream", ["--batch", "x"])
    assert service.pid(tmp_path / "stream") is None
    assert service.stop(tmp_path / "stream") is None


def test_a_named_input_event_is_passed_to_the_server_whole():
    event = records.parse_event(b'{"image": [[[0.5]]], "flags": [true], "id": "scan-3"}')
    assert event == records.Event({"image": [[[0.5]]], "flags": [True]}, "scan-3")
    with pytest.raises(InvalidInput, match="missing required field 'features'"):
        records.parse_event(b'{"id": 7}')  # nothing to score: refused here, as before
