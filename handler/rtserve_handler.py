"""TorchServe entry point: a thin ``BaseHandler`` subclass.

Parsing, validation and the model live in pure modules of this package; this class wires
them to TorchServe's stages and reports each request's own status.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import torch
from ts.torch_handler.base_handler import BaseHandler

from handler.config import HandlerConfig
from handler.errors import ConfigError
from handler.model import ModelMetadata, load_model, quantize_int8
from handler.schema import Normalizer, ParsedBatch, parse_batch

logger = logging.getLogger(__name__)

METADATA_FILE = "meta.json"
JSON = "application/json"


class RealTimeHandler(BaseHandler):
    """Tabular classifier handler: ``{"features": [...]}`` in, one prediction per request out."""

    def initialize(self, context: Any) -> None:
        """Read the config once, load the weights safely, and warm the model up.

        Raises:
            ConfigError: bad ``handler:`` settings, or missing or inconsistent artifacts.
        """
        self.context = context
        model_dir = context.system_properties["model_dir"]
        self.config = HandlerConfig.from_model_yaml(context.model_yaml_config)
        manifest_model = (context.manifest or {}).get("model", {})
        weights = manifest_model.get("serializedFile")
        if not weights:
            raise ConfigError("the archive has no serialized weights file (--serialized-file)")
        self.meta = ModelMetadata.load(os.path.join(model_dir, METADATA_FILE))
        self.model_version = str(manifest_model.get("modelVersion") or self.meta.version)
        torch.set_num_threads(self.config.num_threads)
        model = load_model(os.path.join(model_dir, weights), self.meta)
        if self.config.quantize:
            model = quantize_int8(model)
        if self.config.torchscript:
            model = _script(model)
        self.model = model
        self.normalize = Normalizer(self.meta.mean, self.meta.std)
        self._json_parts = _json_parts(self.meta.labels, self.model_version)
        self.device = torch.device("cpu")
        self._warm_up()
        self.initialized = True
        logger.info(
            "loaded %s version %s (%d features, %d classes, torchscript=%s, quantize=%s)",
            context.model_name, self.model_version, self.meta.n_features,
            len(self.meta.labels), self.config.torchscript, self.config.quantize,
        )

    def _warm_up(self) -> None:
        """Run the request path a few times so the first real request pays no one-off costs.

        Parsing, normalization, the forward pass and answer assembly run on a synthetic batch
        (without the per-batch log line, so the log only counts real batches).
        """
        row = {"body": {"features": [0.0] * self.meta.n_features}}
        heads, tail = self._json_parts
        for _ in range(self.config.warmup_batches):
            batch = parse_batch([row, row], self.meta.n_features, self.config.feature_limit)
            batch.inputs = self.normalize(batch.inputs)
            _, probabilities = self.inference(batch)
            classes = probabilities.argmax(dim=1).tolist()
            for cls, probs in zip(classes, probabilities.tolist()):
                _ = heads[cls] + ", ".join(map(float.__repr__, probs)) + tail

    def preprocess(self, data: list) -> ParsedBatch:
        """Parse and validate every request of the batch; normalize the valid rows."""
        batch = parse_batch(data, self.meta.n_features, self.config.feature_limit)
        if batch.inputs is not None:
            batch.inputs = self.normalize(batch.inputs)
        if self.config.log_batches:
            logger.info("batch size=%d valid=%d", batch.size, len(batch.rows))
        return batch

    def inference(self, batch: ParsedBatch, *args: Any, **kwargs: Any) -> tuple:
        """Forward pass over the valid rows under ``torch.inference_mode``."""
        if batch.inputs is None:
            return batch, None
        with torch.inference_mode():
            probabilities = torch.softmax(self.model(batch.inputs), dim=1)
        return batch, probabilities

    def postprocess(self, data: tuple) -> list[str]:
        """One JSON document per request, in order; invalid requests get their own 400."""
        batch, probabilities = data
        out: list[str] = [""] * batch.size
        if probabilities is not None:
            probs = probabilities.tolist()
            classes = probabilities.argmax(dim=1).tolist()
            if bool(torch.isfinite(probabilities).all()):
                heads, tail = self._json_parts
                for row, idx in enumerate(batch.rows):
                    out[idx] = heads[classes[row]] + ", ".join(map(float.__repr__, probs[row])) + tail
            else:  # never seen (inputs are bounded); json.dumps writes NaN/Infinity
                labels = self.meta.labels
                for row, idx in enumerate(batch.rows):
                    cls = classes[row]
                    out[idx] = json.dumps({"prediction": cls, "label": labels[cls],
                                           "probabilities": probs[row],
                                           "model_version": self.model_version})
        for idx, error in batch.errors.items():
            out[idx] = json.dumps(error.body())
            self.context.set_response_status(error.status, _reason_phrase(error.message), idx)
        for idx in range(batch.size):
            self.context.set_response_content_type(idx, JSON)
        return out


def _script(model: torch.nn.Module) -> torch.jit.ScriptModule:
    """``torch.jit.script`` without its deprecation warning (TorchScript still runs fastest here)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.script(model)


def _json_parts(labels: list[str], version: str) -> tuple[list[str], str]:
    """The constant parts of an answer, so that postprocess only joins the probabilities.

    ``head[cls] + ", ".join(map(float.__repr__, probs)) + tail`` is byte for byte what
    ``json.dumps({"prediction": cls, "label": ..., "probabilities": probs, "model_version": ...})``
    writes for finite probabilities (json writes floats with ``float.__repr__``).
    """
    heads = [f'{{"prediction": {cls}, "label": {json.dumps(label)}, "probabilities": ['
             for cls, label in enumerate(labels)]
    return heads, f'], "model_version": {json.dumps(version)}}}'


def _reason_phrase(message: str) -> str:
    """An HTTP reason phrase: printable ASCII on one line, bounded in length."""
    text = "".join(ch if 32 <= ord(ch) < 127 else "?" for ch in message)
    return text[:200]
