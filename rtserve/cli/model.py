"""``python -m rtserve model``: train the demo, package any classifier, check an artifact directory.

    python -m rtserve model train --version 1.0 --out artifacts/1.0 --epochs 1 --hidden 64
    python -m rtserve model export my_module:packaging --version 1.0 --out artifacts/my-model/1.0
    python -m rtserve model check artifacts/my-model/1.0 --version 1.0

``my_module.packaging()`` returns a dict with ``model``, ``train_features``, ``feature_names``,
``labels`` (a classifier) or ``outputs`` (one output of any kind), and optionally ``holdout``.
See docs/bring-your-own-model.md.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from rtserve.cli.common import command, group
from rtserve.errors import PackagingError

logger = logging.getLogger(__name__)

MODEL_CONFIG = (
    ["--model-config"],
    {
        "type": Path,
        "help": "the model config the archive will carry (make archive's MODEL_CONFIG): "
        "the program is checked on its batch sizes (default: model/model-config.yaml)",
    },
)


def cmd_train(args: argparse.Namespace) -> int:
    """Train the demo model deterministically and write its artifact directory."""
    from rtserve.model.train import train_and_package

    train_and_package(args.version, args.out, args.epochs, args.hidden, args.seed, args.lr, args.model_config)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Export the model MODULE:FUNCTION returns."""
    from rtserve.model.package import export, load_entry

    spec = load_entry(args.entry)()
    if not isinstance(spec, dict):
        raise PackagingError(f"{args.entry}() must return a dict, got {type(spec).__name__}")
    try:
        export(
            spec.pop("model", None),
            spec.pop("train_features", None),
            version=args.version,
            out_dir=args.out,
            model_config=args.model_config,
            **spec,
        )
    except TypeError as exc:  # a key export() does not take
        raise PackagingError(f"{args.entry}(): {exc}") from exc
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """Validate an artifact directory and replay its golden set."""
    from rtserve.model.package import check, describe_outputs

    meta = check(args.artifacts, args.version)
    logger.info(
        "%s: %s %s (%s), %d features, %s, golden set of %d rows replayed",
        args.artifacts,
        meta.name,
        meta.version,
        meta.format,
        meta.n_features,
        describe_outputs(meta.signature),
        len((meta.golden or {}).get("features") or []),
    )
    return 0


def add(groups: argparse._SubParsersAction) -> None:
    commands = group(groups, "model", __doc__)
    command(
        commands,
        "train",
        cmd_train,
        (["--version"], {"required": True, "help": "model version recorded in meta.json"}),
        (["--out"], {"required": True, "type": Path, "help": "output directory"}),
        (["--epochs"], {"type": int, "default": 1}),
        (["--hidden"], {"type": int, "default": 64}),
        (["--seed"], {"type": int, "default": 0}),
        (["--lr"], {"type": float, "default": 1e-3}),
        MODEL_CONFIG,
    )
    command(
        commands,
        "export",
        cmd_export,
        (
            ["entry"],
            {
                "metavar": "MODULE:FUNCTION",
                "help": "a function returning {model, train_features, feature_names, labels or outputs[, holdout]}",
            },
        ),
        (["--version"], {"required": True}),
        (["--out"], {"required": True, "type": Path, "help": "the artifact directory"}),
        MODEL_CONFIG,
    )
    command(
        commands,
        "check",
        cmd_check,
        (["artifacts"], {"type": Path}),
        (["--version"], {"help": "the version meta.json must carry"}),
    )
