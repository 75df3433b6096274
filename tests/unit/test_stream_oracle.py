"""The stream tier's oracles (tests/stream/oracle.py), fed records without a broker: exactly once
passes a clean stream and fails on a duplicate, a gap, a stranger (an output of no input offset,
or of another topic), a changed key and an out-of-order record; at least once passes a clean
stream with no duplicate, counts the duplicates a replay leaves, and fails on a gap, a stranger
and first appearances out of order."""

from __future__ import annotations

import pytest

from tests.stream.oracle import Output, at_least_once_of, exactly_once_of

pytestmark = pytest.mark.unit

TOPIC = "events-0123abcd"
#: Offsets per input partition of the streams below.
PER_PARTITION = 6
#: Input partitions: partition p's events go to output partition p % OUT_PARTITIONS, so that one
#: output partition holds several input partitions' outputs.
IN_PARTITIONS = 3
OUT_PARTITIONS = 2
#: Each input partition's event at this offset is refused (a dead letter).
REFUSED = 2

ORACLES = [exactly_once_of, at_least_once_of]


def sent() -> dict[tuple[int, int], tuple[bytes, bytes]]:
    return {
        (p, o): (b"k%d-%d" % (p, o % 2), b'{"features": []}')
        for p in range(IN_PARTITIONS)
        for o in range(PER_PARTITION)
    }


def output(role_offsets: dict[str, int], coords: tuple[int, int], events: dict, topic: str = TOPIC) -> tuple:
    """The output record of the event at ``coords``, appended at the next offset of its output partition."""
    partition, offset = coords
    role = "events.dlq" if offset == REFUSED else "predictions"
    out = partition % OUT_PARTITIONS
    place = role_offsets.setdefault((role, out), 0)
    role_offsets[(role, out)] += 1
    record = {"source": {"topic": topic, "partition": partition, "offset": offset}}
    record |= {"reason": "not_json"} if role == "events.dlq" else {"label": "low"}
    return role, Output(out, place, events.get(coords, (b"other",))[0], record)


def stream(order: list[tuple[int, int]], events: dict | None = None, topic: str = TOPIC) -> dict[str, list[Output]]:
    """The outputs of the events at ``order``'s coordinates, written in that order."""
    events = sent() if events is None else events
    offsets: dict = {}
    outputs: dict[str, list[Output]] = {"predictions": [], "events.dlq": []}
    for coords in order:
        role, out = output(offsets, coords, events, topic)
        outputs[role].append(out)
    return outputs


def interleaved() -> list[tuple[int, int]]:
    """Every event once, the input partitions interleaved (as a consumer of them all writes)."""
    return [(p, o) for o in range(PER_PARTITION) for p in range(IN_PARTITIONS)]


@pytest.mark.parametrize("oracle", ORACLES)
def test_a_clean_stream_passes_with_every_event_in_its_place(oracle):
    events = sent()
    written = oracle(stream(interleaved()), events, TOPIC)
    assert len(written.letters) == IN_PARTITIONS
    assert len(written.predictions) + len(written.letters) == len(events)
    assert written.duplicates == {}
    assert {(r["source"]["partition"], r["source"]["offset"]) for r in written.predictions} == {
        c for c in events if c[1] != REFUSED
    }
    # placed: each prediction's output coordinates, in the output topic's order
    assert written.placed == sorted(written.placed) and len(set(written.placed)) == len(written.predictions)


@pytest.mark.parametrize("oracle", ORACLES)
def test_the_outputs_order_is_read_from_their_coordinates_not_from_the_list(oracle):
    outputs = stream(interleaved())
    shuffled = {role: list(reversed(outs)) for role, outs in outputs.items()}
    assert oracle(shuffled, sent(), TOPIC) == oracle(outputs, sent(), TOPIC)


@pytest.mark.parametrize("again", [(1, 3), (0, REFUSED)], ids=["a prediction twice", "a dead letter twice"])
def test_exactly_once_fails_on_a_duplicate(again):
    order = [*interleaved(), again]  # written again at the end (as a second committed transaction would)
    with pytest.raises(AssertionError, match=rf"^1 duplicates \[\({again[0]}, {again[1]}\)\], 0 gaps"):
        exactly_once_of(stream(order), sent(), TOPIC)


def test_exactly_once_fails_on_an_event_both_predicted_and_dead_lettered():
    outputs = stream(interleaved())
    predicted = outputs["predictions"][-1]
    letter = {"source": predicted.record["source"], "reason": "not_json"}
    outputs["events.dlq"].append(Output(predicted.partition, 10**6, predicted.key, letter))
    _, partition, offset = predicted.source
    with pytest.raises(AssertionError, match=rf"^1 duplicates \[\({partition}, {offset}\)\], 0 gaps"):
        exactly_once_of(outputs, sent(), TOPIC)


@pytest.mark.parametrize("oracle", ORACLES)
@pytest.mark.parametrize("missing", [(0, 0), (1, REFUSED), (2, PER_PARTITION - 1)])
def test_a_gap_fails(oracle, missing):
    order = [c for c in interleaved() if c != missing]
    with pytest.raises(AssertionError, match=rf"1 gaps \[\('{TOPIC}', {missing[0]}, {missing[1]}\)\]"):
        oracle(stream(order), sent(), TOPIC)


@pytest.mark.parametrize("oracle", ORACLES)
def test_an_output_of_an_offset_never_sent_is_a_stranger(oracle):
    events = sent()
    beyond = (1, PER_PARTITION)  # the offset after partition 1's last event
    outputs = stream([*interleaved(), beyond], {**events, beyond: (events[(1, 0)][0], b"")})
    with pytest.raises(AssertionError, match=rf"1 outputs of no event \[\('{TOPIC}', 1, {PER_PARTITION}\)\]"):
        oracle(outputs, events, TOPIC)


@pytest.mark.parametrize("oracle", ORACLES)
def test_an_output_of_another_topics_event_is_a_stranger(oracle):
    outputs = stream(interleaved())
    other = stream([(0, 0)], topic="events-other")["predictions"][0]
    outputs["predictions"].append(Output(other.partition, 10**6, other.key, other.record))
    with pytest.raises(AssertionError, match=r"1 outputs of no event \[\('events-other', 0, 0\)\]"):
        oracle(outputs, sent(), TOPIC)


@pytest.mark.parametrize("oracle", ORACLES)
def test_an_output_that_lost_its_events_key_fails(oracle):
    outputs = stream(interleaved())
    first = outputs["predictions"][0]
    outputs["predictions"][0] = Output(first.partition, first.offset, b"another key", first.record)
    with pytest.raises(AssertionError, match=r"has key b'another key'"):
        oracle(outputs, sent(), TOPIC)


@pytest.mark.parametrize("oracle", ORACLES)
def test_an_out_of_order_record_fails(oracle):
    order = interleaved()
    # partition 1's offsets 3 and 4 (two predictions in one output partition) swapped
    i, j = order.index((1, 3)), order.index((1, 4))
    order[i], order[j] = order[j], order[i]
    with pytest.raises(AssertionError, match=r"predictions: out of order in output partition 1: input 1:3 after 1:4"):
        oracle(stream(order), sent(), TOPIC)


@pytest.mark.parametrize("oracle", ORACLES)
def test_partitions_interleaved_in_one_output_partition_are_each_in_order(oracle):
    """Input partitions 0 and 2 share output partition 0: one after the other, or interleaved,
    each in its own order, passes."""
    one_after_the_other = sorted(interleaved())
    written = oracle(stream(one_after_the_other), sent(), TOPIC)
    assert len(written.predictions) + len(written.letters) == len(sent())


def replayed(crash_at: int, committed: int) -> list[tuple[int, int]]:
    """Partition 0 written up to ``crash_at`` (exclusive), then, after a crash, again from its
    ``committed`` offset: what an at-least-once consumer leaves (the other partitions once)."""
    others = [(p, o) for p in range(1, IN_PARTITIONS) for o in range(PER_PARTITION)]
    return [(0, o) for o in range(crash_at)] + [(0, o) for o in range(committed, PER_PARTITION)] + others


def test_at_least_once_counts_the_duplicates_of_a_replay():
    crash_at, committed = PER_PARTITION - 1, 1
    written = at_least_once_of(stream(replayed(crash_at, committed)), sent(), TOPIC)
    assert written.duplicates == {(0, o): 1 for o in range(committed, crash_at)}
    assert len(written.predictions) + len(written.letters) == len(sent()) + sum(written.duplicates.values())


def test_exactly_once_fails_on_the_same_replay():
    crash_at, committed = PER_PARTITION - 1, 1
    with pytest.raises(AssertionError, match=rf"^{crash_at - committed} duplicates"):
        exactly_once_of(stream(replayed(crash_at, committed)), sent(), TOPIC)


def test_at_least_once_fails_on_first_appearances_out_of_order():
    """A replay may repeat offsets, but an offset first written after a later one means the
    partition's order was broken."""
    order = [(0, 0), (0, 1), (0, REFUSED), (0, 4), (0, 1), (0, 3), (0, 5)]
    order += [(p, o) for p in range(1, IN_PARTITIONS) for o in range(PER_PARTITION)]
    with pytest.raises(AssertionError, match=r"predictions: out of order in output partition 0: input 0:3 after 0:4"):
        at_least_once_of(stream(order), sent(), TOPIC)
