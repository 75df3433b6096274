"""The command line: ``python -m rtserve <group> <command>``.

    python -m rtserve client predict realtime-classifier examples/request.json
    python -m rtserve versions promote realtime-classifier 2.0
    python -m rtserve server start --run-dir .run --models realtime-classifier=realtime-classifier_1.0.mar
    python -m rtserve probe ready
    python -m rtserve <group> --help

Each group is the module of this package of its name; a command line builds only its group's parser,
and the domain packages are imported when the command runs. An :class:`rtserve.errors.RtserveError`
ends any command with ``error: <message>`` on stderr and exit status 1; a parse error exits 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from importlib import import_module

from rtserve.errors import EXIT_ERROR, RtserveError

#: The groups (the modules of this package of the same names), in the order ``--help`` lists them.
GROUPS = (
    "client",
    "versions",
    "live",
    "server",
    "probe",
    "gateway",
    "monitor",
    "model",
    "k8s",
    "cluster",
    "kafka",
    "stream",
    "records",
    "cassandra",
)


def build_parser(group: str | None = None) -> argparse.ArgumentParser:
    """The argument parser: one sub-parser per group, one per command below it.

    Only the sub-parser of ``group`` when it names one (what a command line that starts with it needs).
    """
    parser = argparse.ArgumentParser(
        prog="python -m rtserve", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    groups = parser.add_subparsers(dest="group", required=True, metavar="GROUP")
    for name in (group,) if group in GROUPS else GROUPS:
        import_module(f"{__name__}.{name}").add(groups)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command and return its exit status.

    An rtserve error prints one ``error:`` line on stderr and returns :data:`~rtserve.errors.EXIT_ERROR`.
    """
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format=getattr(args, "log_format", "%(message)s"),
        stream=sys.stderr if getattr(args, "log_stream", "") == "stderr" else sys.stdout,
    )
    try:
        return args.func(args) or 0
    except RtserveError as exc:
        sys.stdout.flush()  # what the command printed comes first where both streams meet
        sys.stderr.write(f"error: {exc}\n")
        sys.stderr.flush()
        return EXIT_ERROR
