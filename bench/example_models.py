"""The example models the per-kind checks run (make bench-kinds, make gpu-check), one table entry each.

An entry names an example as ``make example EXAMPLE_NAME=<name>`` does: its module is
``examples/<name with - as _>.py``, its artifacts ``artifacts/<name>/<version>`` and its archive
``<name>_<version>.mar``. An entry whose module is not in the checkout is left out (an example
written on another branch). Nothing here imports torch: the GPU check reads this on a machine with
only torch and numpy.

    python -m bench.example_models            # the examples present, one name a line
    python -m bench.example_models --build    # make example for each (make examples)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: The version ``make example`` packages unless told otherwise (mk/build.mk's EXAMPLE_VERSION).
VERSION = "1.0"


@dataclass(frozen=True)
class Example:
    """One example model: its ``EXAMPLE_NAME`` and what it shows."""

    name: str
    what: str

    @property
    def module(self) -> Path:
        """Its training and packaging script, ``examples/<name>.py`` (``-`` read as ``_``)."""
        return REPO / "examples" / f"{self.name.replace('-', '_')}.py"

    def artifacts(self, root: Path, version: str = VERSION) -> Path:
        """Its artifact directory under ``root`` (model.pt2 + meta.json), as ``make example`` writes it."""
        return root / self.name / version

    def archive(self, version: str = VERSION) -> str:
        """Its archive's file name in a model store."""
        return f"{self.name}_{version}.mar"


#: Every example the per-kind checks cover, in the order they run.
EXAMPLES = (
    Example("diabetes", "regression, 10 float features"),
    Example("digits", "CNN classifier, one image input [1, 8, 8]: arrays, base64 PNG or raw PNG"),
    Example("penguins", "classifier, named inputs: float [4] and int64 ids [2]"),
    Example("names", "sequence classifier, one int64 sequence of 1-24 character ids"),
)


def present(names: list[str] | None = None) -> tuple[list[Example], list[Example]]:
    """(the examples whose module is in the checkout, those left out), in table order.

    Args:
        names: only these (default: every entry).

    Raises:
        ValueError: a name that is not in the table.
    """
    known = {e.name: e for e in EXAMPLES}
    unknown = sorted(set(names or ()) - set(known))
    if unknown:
        raise ValueError(f"unknown example(s) {', '.join(unknown)}: one of {', '.join(known)}")
    chosen = [e for e in EXAMPLES if names is None or e.name in names]
    return [e for e in chosen if e.module.is_file()], [e for e in chosen if not e.module.is_file()]


def build(examples: list[Example], artifacts_root: Path, model_store: Path, make: str = "make") -> None:
    """``make example EXAMPLE_NAME=<name>`` for each: trained, checked and archived unless up to date.

    Raises:
        subprocess.CalledProcessError: a build failed (its output went to stdout).
    """
    for example in examples:
        subprocess.run(
            [
                make,
                "-s",
                "--no-print-directory",
                "example",
                f"EXAMPLE_NAME={example.name}",
                f"EXAMPLE_VERSION={VERSION}",
                f"DEMO_ARTIFACTS={artifacts_root}",
                f"MODEL_STORE={model_store}",
            ],
            cwd=REPO,
            check=True,
        )


def main(argv: list[str] | None = None) -> int:
    """Print the examples present, or build them (``--build``)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", action="store_true", help="make example for each one present")
    parser.add_argument("--artifacts", type=Path, default=REPO / "artifacts", help="make's DEMO_ARTIFACTS")
    parser.add_argument("--model-store", type=Path, default=REPO / "model_store")
    args = parser.parse_args(argv)
    examples, absent = present()
    for example in absent:
        print(f"skipped {example.name}: {example.module.relative_to(REPO)} is not in this checkout", file=sys.stderr)
    if args.build:
        build(examples, args.artifacts.resolve(), args.model_store.resolve())
    else:
        print("\n".join(e.name for e in examples))
    return 0


if __name__ == "__main__":
    sys.exit(main())
