"""The stream tier's oracles, pure (no broker): what a stream wrote, as decoded from its output
topics, checked against the events it was sent.

:func:`exactly_once_of`: the input offsets are exactly the union of the predictions' and the
dead letters' source offsets (no duplicate, no gap, no output of another event), every output
keeps its event's key, and in each output partition the outputs of one input partition follow
its offsets. :func:`at_least_once_of`: every input offset at least once and nothing else, the
duplicates counted and returned, the order checked on each offset's first appearance (a replay
after a crash repeats a partition's outputs from its committed offset on).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

#: The output topics by role, in the order the oracles read them.
OUTPUTS = ("predictions", "events.dlq")

#: An input event's coordinates: (partition, offset).
Coordinates = tuple[int, int]


@dataclass(frozen=True)
class Output:
    """One output record as read from its topic: where it sits, its key and its decoded value."""

    partition: int
    offset: int
    key: bytes | None
    record: dict

    @property
    def source(self) -> tuple[str, int, int]:
        """The (topic, partition, offset) of the event it answers."""
        source = self.record["source"]
        return source["topic"], source["partition"], source["offset"]


@dataclass
class Written:
    """What a stream wrote: the records of each output topic in their order (output partition,
    then offset), decoded; ``placed``: each prediction's (partition, offset) in the output topic;
    ``duplicates``: the extra copies of each input event written more than once (at-least-once
    only: exactly once fails on any)."""

    predictions: list[dict]
    letters: list[dict]
    placed: list[tuple[int, int]]
    duplicates: dict[Coordinates, int] = field(default_factory=dict)

    def summary(self, sent: dict) -> str:
        extra = sum(self.duplicates.values())
        return (
            f"{len(sent)} events in, {len(self.predictions)} predictions, {len(self.letters)} dead letters, "
            f"{extra} duplicates ({len(self.duplicates)} events written more than once), 0 gaps"
        )


def exactly_once_of(
    outputs: dict[str, list[Output]], sent: dict[Coordinates, tuple[bytes, bytes]], input_topic: str
) -> Written:
    """Check ``outputs`` (by role, see :data:`OUTPUTS`) against the events ``sent`` to ``input_topic``.

    Raises:
        AssertionError: a duplicate, a gap, an output of no event sent (another offset or another
            topic), a changed key, or an input partition's outputs out of its offsets' order.
    """
    ordered = _ordered(outputs)
    counted = Counter(o.source for name in OUTPUTS for o in ordered[name])
    duplicates = {(p, o): n - 1 for (_, p, o), n in counted.items() if n > 1}
    _no_gap_nor_stranger(counted, sent, input_topic, duplicates)
    for name in OUTPUTS:
        _in_order(name, ordered[name], sent, first_appearance=False)
    return _written(ordered, {})


def at_least_once_of(
    outputs: dict[str, list[Output]], sent: dict[Coordinates, tuple[bytes, bytes]], input_topic: str
) -> Written:
    """As :func:`exactly_once_of`, but an event may be written more than once: its copies are counted
    (``Written.duplicates``), and the order is checked on each event's first appearance only.

    Raises:
        AssertionError: a gap, an output of no event sent, a changed key, or an input partition's
            first appearances out of its offsets' order.
    """
    ordered = _ordered(outputs)
    counted = Counter(o.source for name in OUTPUTS for o in ordered[name])
    _no_gap_nor_stranger(counted, sent, input_topic, {})
    seen: set[tuple[str, int, int]] = set()
    for name in OUTPUTS:
        _in_order(name, ordered[name], sent, first_appearance=True, seen=seen)
    return _written(ordered, {(p, o): n - 1 for (_, p, o), n in counted.items() if n > 1})


def _ordered(outputs: dict[str, list[Output]]) -> dict[str, list[Output]]:
    """Each role's outputs in their topic's order (output partition, then offset)."""
    unknown = set(outputs) - set(OUTPUTS)
    assert not unknown, f"outputs of unknown roles: {sorted(unknown)}"
    return {name: sorted(outputs.get(name, []), key=lambda o: (o.partition, o.offset)) for name in OUTPUTS}


def _no_gap_nor_stranger(
    counted: Counter, sent: dict[Coordinates, tuple[bytes, bytes]], input_topic: str, duplicates: dict
) -> None:
    inputs = {(input_topic, p, o) for p, o in sent}
    gaps = sorted(inputs - set(counted))
    strangers = sorted(set(counted) - inputs)
    assert (len(duplicates), gaps, strangers) == (0, [], []), (
        f"{len(duplicates)} duplicates {sorted(duplicates)[:10]}, {len(gaps)} gaps {gaps[:10]}, "
        f"{len(strangers)} outputs of no event {strangers[:10]}"
    )


def _in_order(
    name: str,
    outputs: list[Output],
    sent: dict[Coordinates, tuple[bytes, bytes]],
    first_appearance: bool,
    seen: set | None = None,
) -> None:
    """In each output partition, each input partition's outputs (or their first appearances) in
    offset order; every output keeps its event's key."""
    last: dict[tuple[int, int], int] = {}
    for out in outputs:
        _, partition, offset = out.source
        assert out.key == sent[(partition, offset)][0], (
            f"{name} {out.partition}:{out.offset} has key {out.key!r}, its event "
            f"{partition}:{offset} {sent[(partition, offset)][0]!r}"
        )
        if first_appearance:
            if out.source in seen:
                continue
            seen.add(out.source)
        lane = (out.partition, partition)
        assert offset > last.get(lane, -1), (
            f"{name}: out of order in output partition {out.partition}: input {partition}:{offset} "
            f"after {partition}:{last[lane]}"
        )
        last[lane] = offset


def _written(ordered: dict[str, list[Output]], duplicates: dict[Coordinates, int]) -> Written:
    return Written(
        [o.record for o in ordered["predictions"]],
        [o.record for o in ordered["events.dlq"]],
        [(o.partition, o.offset) for o in ordered["predictions"]],
        duplicates,
    )
