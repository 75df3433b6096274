"""TorchServe entry point: a thin ``BaseHandler`` subclass wiring this package's pure modules to its stages.

Unlike ``BaseHandler`` (request 0 decides), each request is decided alone: explain by its ``explain`` header,
protocol by its body (:mod:`handler.protocols`; ``url_path``-marked ``/predictions`` and ``/explanations`` take
only ``{"features": [...]}``), binary OIP by ``Inference-Header-Content-Length``; each gets its own status.
"""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import re
import time
from functools import partial
from typing import Any

import torch
from ts.torch_handler.base_handler import BaseHandler

from handler import worker_io
from handler.config import HandlerConfig
from handler.device import choose_device, on_device
from handler.errors import ConfigError, ExplainCapacityExceeded, InvalidInput
from handler.explain import EXPLAINED, Explainer, unsupported, unsupported_inputs, unsupported_outputs
from handler.inputs import NamedInputs
from handler.model import (
    CLASSIFICATION,
    METADATA_FILE,
    MULTI_LABEL,
    PROGRAM_FILE,
    CutPadding,
    ModelMetadata,
    answer_columns,
    load_program,
)
from handler.protocols import (
    BINARY_CONTENT_TYPE,
    BINARY_HEADER,
    KSERVE_V1,
    OIP_V2,
    BinaryBody,
    answer,
    detect,
    encode_binary,
    grpc_error,
    outputs_answer,
    outputs_document,
    parse_named_request,
    parse_request,
)
from handler.records import ROUTE_HEADER, Recorder, RecordsConfig, RecordsUnavailable, Spool, spool_bytes, spool_dir
from handler.schema import ParsedBatch, parse_batch, prediction_document, request_body
from handler.signature import OUTPUT_NAMES, REGRESSION, target_names
from handler.telemetry import (
    TORCHSERVE_METRICS_LOGGER,
    Telemetry,
    quiet_torchserve_batch_lines,
    require_multiprocess_dir,
)
from handler.warmup import is_warmup_batch, warmup_key

logger = logging.getLogger(__name__)

JSON = "application/json"
#: The response header ``context.set_response_content_type`` sets.
CONTENT_TYPE = "content-type"
#: The request header TorchServe's frontend sets per request, and its value on explain routes.
EXPLAIN_HEADER = "explain"
EXPLAIN_VALUE = "True"
#: The header TorchServe's frontend sets (possibly empty) on ``/predictions`` and ``/explanations``.
PLAIN_ROUTE_HEADER = "url_path"
#: The types of a request body TorchServe did not decode (its ``body`` parameter).
_RAW_BODIES = frozenset((bytes, bytearray, str))
_ROUTE_HEADER_LOWER = ROUTE_HEADER.lower()
#: A route a client may name in :data:`handler.records.ROUTE_HEADER` (others are ignored).
_ROUTE_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,31}")


class RealTimeHandler(BaseHandler):
    """Tabular model handler: ``{"features": [...]}`` in, one prediction per request out.

    The answer follows the model's output kind (``meta.json``): a classifier's class and softmax
    probabilities; a multi-label model's labels and sigmoid probabilities; a regression's values; an
    embedding; with several outputs, each output's answer by name. On the explain routes the answer is
    an explanation of one class's or label's probability or one regression target's value; an
    embedding, or a model with several outputs, gets a 501.
    """

    def initialize(self, context: Any) -> None:
        """Read the config once, load the exported program safely, and warm the model up.

        Raises:
            ConfigError: bad ``handler:`` settings, or missing or inconsistent artifacts.
        """
        self.context = context
        model_dir = context.system_properties["model_dir"]
        self.config = HandlerConfig.from_model_yaml(context.model_yaml_config)
        manifest_model = (context.manifest or {}).get("model", {})
        program = manifest_model.get("serializedFile")
        if program != PROGRAM_FILE:
            raise ConfigError(
                f"the archive's serialized file must be the exported program "
                f"{PROGRAM_FILE} (make archive packs it), got {program!r}"
            )
        self.meta = ModelMetadata.load(os.path.join(model_dir, METADATA_FILE))
        self.model_version = str(manifest_model.get("modelVersion") or self.meta.version)
        torch.set_num_threads(self.config.num_threads)
        self.device = choose_device(self.config.device, context.system_properties.get("gpu_id"))
        program = load_program(os.path.join(model_dir, PROGRAM_FILE), self.device, direct=self.config.direct_forward)
        #: A model with named inputs parses each body through them (:mod:`handler.inputs`).
        self.named = NamedInputs(self.meta.input_specs) if self.meta.inputs else None
        if self.named is not None and self.named.sequence is not None:
            program = CutPadding(program, *self.named.sequence)
        self.model = on_device(program, self.device)  # CPU tensors in and out
        self._json_parts = _json_parts(self.meta.labels, self.model_version)
        #: Every output's signature in column order; :attr:`output` is the first, which metrics,
        #: drift and records follow.
        self.signature = self.meta.signature
        self.output = self.meta.output
        #: The one branch per batch: one classifier takes today's path, anything else :meth:`_outputs`.
        self.classifier = self.meta.kind == CLASSIFICATION and len(self.signature) == 1
        self._output_names = OUTPUT_NAMES if self.classifier else tuple(out["name"] for out in self.signature)
        #: The names an explain request's ``target`` may give (a classifier's class: its index only).
        self._target_names = target_names(self.output)
        self._target_noun = "label" if self.output["kind"] == MULTI_LABEL else "target"
        self.explainer = (
            Explainer(
                program,
                self.meta.mean,
                self.meta.feature_names,
                self._target_names,
                baseline=self.config.explain_baseline,
                n_steps=self.config.explain_steps,
                internal_batch_size=self.config.explain_internal_batch_size,
                device=self.device,
                kind=self.meta.kind,
            )
            if self.meta.kind in EXPLAINED and self.meta.float_inputs and len(self.signature) == 1
            else None
        )
        self.telemetry = self._telemetry(context) if self.config.metrics else None
        self.records = RecordsConfig.from_model_yaml(context.model_yaml_config)
        self.recorder = (
            Recorder(
                Spool(spool_dir(), spool_bytes()),
                context.model_name,
                self.model_version,
                self.meta.labels,
                self.records.inputs,
                kind=self.meta.kind,
            )
            if self.records.enabled
            else None
        )
        self.warmup_key = warmup_key()  # rtserve.server's warm-up requests are not recorded
        quiet_torchserve_batch_lines()
        self.buffered_reads = self.config.buffered_reads and worker_io.install()
        lean = worker_io.install_lean(context, TORCHSERVE_METRICS_LOGGER) if self.config.lean_worker else None
        self._warm_up()
        # torch, the program and the handler live as long as the worker: out of every later
        # collection, or each full one walks their ~180,000 objects (57 ms measured), a stall that
        # batches of parsed JSON arrays set off every few seconds at c=64 (digits' p99 97-163 ms,
        # 12-13 ms frozen). With nothing left old, a full collection would follow every 10th
        # middle one (5 % of c=64 throughput, make bench-quick): every 1,000th instead.
        gc.collect()
        gc.freeze()
        gc.set_threshold(700, 10, 1000)
        self.initialized = True
        logger.info(
            "loaded %s version %s on %s (%s %s: %d features, %s, exported program, buffered reads=%s)",
            context.model_name,
            self.model_version,
            self.device,
            self.meta.name,
            self.meta.version,
            self.meta.n_features,
            f"{len(self.meta.labels)} classes"
            if self.classifier
            else f"a {self.output['kind']} output of width {self.output['width']}"
            if len(self.signature) == 1
            else f"{len(self.signature)} outputs ({', '.join(out['name'] for out in self.signature)})",
            self.buffered_reads,
        )
        logger.info("forward pass: %s", program.forward_path)
        logger.info(
            "lean worker: %s",
            "off (handler.lean_worker)"
            if lean is None
            else ", ".join(lean) or "nothing applies (see the warnings above)",
        )

    def _telemetry(self, context: Any) -> Telemetry:
        """Metrics and drift for this worker (see :mod:`handler.telemetry`).

        Raises:
            ConfigError: the server gave the workers no metrics directory.
        """
        require_multiprocess_dir()
        return Telemetry(
            context.model_name,
            self.model_version,
            self.meta.labels,
            self.meta.feature_names,
            self.meta.drift_reference,
            self.config.drift_window,
            self.config.drift_export_seconds,
            self.config.drift_flush_rows,
        )

    def handle(self, data: list, context: Any) -> list[str]:
        """Preprocess, inference and postprocess, timed per stage; then the records, before the answers.

        A batch of warm-up requests only (:mod:`handler.warmup`) is answered, not recorded. A batch
        whose records do not fit in the spool is answered without them, or 503 with
        ``records.required``.
        """
        self.context = context
        t0 = time.perf_counter()
        batch = self.preprocess(data)
        t1 = time.perf_counter()
        result = self.inference(batch)
        t2 = time.perf_counter()
        out = self.postprocess(result)
        t3 = time.perf_counter()
        if (self.telemetry is None and self.recorder is None) or is_warmup_batch(
            context.request_processor, self.warmup_key
        ):
            return out
        if self.telemetry is not None:
            self.telemetry.record(batch, batch.classes, (t1 - t0, t2 - t1, t3 - t2))
        if self.recorder is not None:
            ids = context.request_ids or {}
            lines = self.recorder.lines(
                batch, data, out, [ids.get(i, "") for i in range(batch.size)], batch.routes, t3 - t0
            )
            kept = self.recorder.write(lines)
            if self.telemetry is not None:
                counter = self.telemetry.metrics.records_written if kept else self.telemetry.metrics.records_dropped
                counter.inc(len(lines))
            if not kept and self.records.required:
                return self._refuse(batch.size)
        return out

    def _refuse(self, size: int) -> list[str]:
        """A 503 for every request of the batch: its record cannot be kept (``records.required``)."""
        error = RecordsUnavailable(
            "the request's record cannot be kept (the records spool is full: "
            "the records store has been away too long) and records.required "
            "is set: retry shortly"
        )
        body = json.dumps(error.body())
        for idx, rp in enumerate(self.context.request_processor[:size]):
            self.context.set_response_status(error.status, _reason_phrase(error.message), idx)
            for key, value in error.headers.items():
                rp.add_response_property(key, value)
            rp.add_response_property(CONTENT_TYPE, JSON)
        return [body] * size

    def _warm_up(self) -> None:
        """Run the request path a few times so the first real request pays no one-off costs.

        Parsing, the forward pass and answer assembly run on a synthetic batch
        (without the per-batch log line, so the log only counts real batches).
        """
        row = {"body": {"features": [0.0] * self.meta.n_features}}
        heads, tail = self._json_parts
        for _ in range(self.config.warmup_batches):
            batch = parse_batch([row, row], self.meta.n_features, self.config.feature_limit)
            _, probabilities = self.inference(batch)
            if not self.classifier:
                version = self.model_version
                _ = [json.dumps(outputs_document(self.signature, v, version)) for v in probabilities.tolist()]
                continue
            classes = probabilities.argmax(dim=1).tolist()
            for cls, probs in zip(classes, probabilities.tolist()):
                _ = heads[cls] + ", ".join(map(float.__repr__, probs)) + tail
        if self.config.warmup_batches and self.explainer is not None:
            x = torch.zeros(1, self.meta.n_features)
            self.explainer.explain(x, [0])  # Captum's first call pays one-off costs too

    def _is_explain(self) -> bool:
        """Never switch the whole batch to ``explain_handle``: explain is decided per request."""
        return False

    def _routes(self) -> tuple[set[int], set[int], list[int], dict[int, str]]:
        """Read the batch's request headers (each ``RequestProcessor``'s) in one pass.

        Returns the indices of the requests that came in on an explain route, of those that came
        in on ``/predictions`` or ``/explanations``, of those without an ``explain`` header (gRPC:
        the frontend sets it on every REST inference route), and the route each client named in
        :data:`ROUTE_HEADER`.
        """
        explain: set[int] = set()
        plain_only: set[int] = set()
        no_route: list[int] = []
        declared: dict[int, str] = {}
        for i, rp in enumerate(self.context.request_processor):
            headers = rp.get_request_properties()
            flag = headers.get(EXPLAIN_HEADER)
            if flag is None:
                no_route.append(i)
            elif flag == EXPLAIN_VALUE:
                explain.add(i)
            if headers.get(PLAIN_ROUTE_HEADER) is not None:
                plain_only.add(i)
            named = headers.get(ROUTE_HEADER) or headers.get(_ROUTE_HEADER_LOWER)
            if named is not None and type(named) is str and _ROUTE_NAME.fullmatch(named):
                declared[i] = named
        return explain, plain_only, no_route, declared

    @staticmethod
    def _route_names(
        batch: ParsedBatch, explain: set[int], plain_only: set[int], no_route: list[int], declared: dict[int, str]
    ) -> list[str]:
        """Each request's route for its record.

        The one its client named; else ``predictions`` or ``explanations``; else the protocol
        (``kserve-v1``, ``oip-v2``; ``rest`` or ``grpc`` for rtserve's own body), with ``-grpc``
        when it came over gRPC and ``-explain`` on an explain route.
        """
        if not declared and not explain and len(plain_only) == batch.size:
            return ["predictions"] * batch.size  # the common batch
        grpc = set(no_route)
        names = []
        for idx in range(batch.size):
            if idx in declared:
                names.append(declared[idx])
            elif idx in plain_only:
                names.append("explanations" if idx in explain else "predictions")
            else:
                request = batch.protocols.get(idx)
                if request is None and idx in batch.oip_grpc:
                    name = "oip-v2-grpc"
                elif request is not None:
                    name = ("kserve-v1" if request.protocol == KSERVE_V1 else "oip-v2") + (
                        "-grpc" if idx in grpc else ""
                    )
                else:
                    name = "grpc" if idx in grpc else "rest"
                names.append(name + ("-explain" if idx in explain else ""))
        return names

    @staticmethod
    def _oip_grpc_requests(data: list, no_route: list[int]) -> dict[int, str]:
        """Open Inference Protocol requests among ``no_route`` (gRPC): request index -> ``id``."""
        found: dict[int, str] = {}
        for i in no_route:
            try:
                body = request_body(data[i])
            except InvalidInput:
                continue
            if detect(body) == OIP_V2:
                request_id = body.get("id")
                found[i] = request_id if isinstance(request_id, str) else ""
        return found

    def _binary_bodies(self, data: list, plain_only: set[int]) -> list:
        """``data`` with each binary tensor data body wrapped in a :class:`BinaryBody`.

        A body is wrapped when its request carries ``Inference-Header-Content-Length`` (in any
        spelling) and TorchServe handed it over undecoded (bytes, or text), for
        :func:`parse_request`. Plain routes keep their bodies.
        """
        raw = [
            i
            for i, row in enumerate(data)
            if type(row) is dict and type(row.get("body")) in _RAW_BODIES and i not in plain_only
        ]
        wrapped = None
        for i in raw:
            length = _request_header(self.context.request_processor[i], BINARY_HEADER)
            if length is not None:
                wrapped = wrapped or list(data)
                wrapped[i] = {"body": BinaryBody(data[i]["body"], length)}
        return data if wrapped is None else wrapped

    def preprocess(self, data: list) -> ParsedBatch:
        """Parse and validate every request of the batch (rtserve's own body, KServe v1 or v2).

        The valid rows stay raw features: the exported program does its own preprocessing.
        """
        explain, plain_only, no_route, declared = self._routes()
        explainable = self.explainer is not None
        limits = dict(limit=self.config.feature_limit, max_instances=self.config.max_instances)
        if self.named is None:
            other = partial(parse_request, n_features=self.meta.n_features, output_names=self._output_names, **limits)
        else:
            other = partial(parse_named_request, named=self.named, output_names=self._output_names, **limits)
        batch = parse_batch(
            self._binary_bodies(data, plain_only),
            self.meta.n_features,
            self.config.feature_limit,
            explain if explainable else (),  # an embedding: no target to parse, a 501 (_outputs)
            len(self._target_names),
            other=other,
            plain_only=plain_only,
            target_names=() if self.classifier else self._target_names,
            target_noun="class" if self.classifier else self._target_noun,
            named=self.named,
        )
        if explain and not explainable:
            batch.targets = {idx: None for idx in explain if idx not in batch.errors}
        if no_route:
            batch.oip_grpc = self._oip_grpc_requests(data, no_route)
        if self.recorder is not None:
            batch.routes = self._route_names(batch, explain, plain_only, no_route, declared)
        if self.config.log_batches:
            logger.info(
                "batch size=%d valid=%d explain=%d kserve=%d rows=%d",
                batch.size,
                batch.size - len(batch.errors),
                len(batch.targets),
                len(batch.protocols),
                len(batch.rows),
            )
        return batch

    def inference(self, batch: ParsedBatch, *args: Any, **kwargs: Any) -> tuple:
        """Forward pass over the valid rows under ``torch.inference_mode``."""
        if batch.inputs is None:
            return batch, None
        if not self.classifier:
            return batch, self._outputs(batch)
        with torch.inference_mode():
            probabilities = torch.softmax(self.model(batch.inputs), dim=1)
        if batch.targets:
            self._explain(batch, probabilities)
        return batch, probabilities

    def _outputs(self, batch: ParsedBatch) -> torch.Tensor:
        """:meth:`inference` for a model that is not one classifier: what its answers carry.

        Sigmoid probabilities (multi-label) or the output itself (regression, embedding); with several
        outputs, each one's in its own columns (:func:`handler.model.answer_columns`). The batch's
        explain requests are explained (:meth:`_explain`), or get a 501 saying why (an embedding,
        several outputs).
        """
        with torch.inference_mode():
            values = answer_columns(self.signature, self.model(batch.inputs))
        if batch.targets:
            self._explain(batch, values)
        return values

    def _explain(self, batch: ParsedBatch, probabilities: torch.Tensor) -> None:
        """Explain up to ``explain_max_per_batch`` requests, each for its own target.

        ``probabilities`` are what the answers carry. The target defaults to the predicted class
        (classifier), the label of the highest probability (multi-label) or the first target
        (regression); the rest of this batch's explain requests get a 503. Without an explainer
        (an embedding, several outputs, or id or boolean inputs) each gets a 501 saying why.
        """
        if self.explainer is None:
            for idx in batch.targets:
                batch.errors[idx] = (
                    unsupported_outputs([out["name"] for out in self.signature])
                    if len(self.signature) > 1
                    else unsupported(self.output["kind"])
                    if self.output["kind"] not in EXPLAINED
                    else unsupported_inputs({s.name: s.dtype for s in self.meta.input_specs})
                )
            return
        limit = self.config.explain_max_per_batch
        chosen = list(batch.targets)[:limit]
        for idx in list(batch.targets)[limit:]:
            batch.errors[idx] = ExplainCapacityExceeded(
                f"this batch already holds {limit} explanation(s), the most the model computes "
                "per batch (handler.explain_max_per_batch): retry shortly"
            )
        row_of = {idx: row for row, idx in enumerate(batch.rows)}
        rows = [row_of[idx] for idx in chosen]
        regression = self.output["kind"] == REGRESSION
        predicted = [0] * len(rows) if regression else probabilities[rows].argmax(dim=1).tolist()
        targets = [batch.targets[idx] if batch.targets[idx] is not None else cls for idx, cls in zip(chosen, predicted)]
        explanations = self.explainer.explain(batch.inputs[rows], targets)
        if self.classifier:
            for idx, cls, explanation in zip(chosen, predicted, explanations):
                batch.explanations[idx] = {
                    **self.explainer.document(explanation),
                    "prediction": cls,
                    "model_version": self.model_version,
                }
            return
        # another kind: the explanation, then the answer /predictions gives for the row
        for idx, values, explanation in zip(chosen, probabilities[rows].tolist(), explanations):
            batch.explanations[idx] = {
                **self.explainer.document(explanation),
                **outputs_document(self.signature, values, self.model_version),
            }

    def postprocess(self, data: tuple) -> list[str]:
        """One answer per request, in order.

        A prediction, an explanation, a protocol's answer (bytes when it carries binary tensor
        data), or the request's own error (400 for bad input, 503 past the explanation ceiling).
        """
        batch, probabilities = data
        out: list[str | bytes] = [""] * batch.size
        binary: set[int] = set()
        processors = self.context.request_processor
        if probabilities is not None and not self.classifier:
            self._encode_outputs(batch, probabilities, out, binary)
        elif probabilities is not None:
            # A few rows of a few classes: plain Python lists cost less than tensor calls.
            probs = probabilities.tolist()
            # Plain answers are assembled from preformatted parts (byte for byte json.dumps);
            # non-finite probabilities (never seen: inputs are bounded) take json.dumps.
            fast = math.isfinite(sum(map(sum, probs)))  # NaN or infinity anywhere: not finite
            classes = (
                [row.index(max(row)) for row in probs]
                if fast  # the first maximum,
                else probabilities.argmax(dim=1).tolist()
            )  # as torch.argmax
            batch.classes = classes
            labels = self.meta.labels
            explanations = batch.explanations
            heads, tail = self._json_parts
            first_row: dict[int, int] = {}
            for row, idx in enumerate(batch.rows):
                first_row.setdefault(idx, row)
                if explanations and idx in explanations:
                    out[idx] = json.dumps(explanations[idx])
                elif idx in batch.protocols:
                    continue
                elif fast:
                    out[idx] = heads[classes[row]] + ", ".join(map(float.__repr__, probs[row])) + tail
                else:
                    out[idx] = json.dumps(prediction_document(classes[row], probs[row], labels, self.model_version))
            for idx, request in batch.protocols.items():
                start, stop = first_row[idx], first_row[idx] + len(request.vectors)
                document = answer(
                    request, classes[start:stop], probs[start:stop], labels, self.context.model_name, self.model_version
                )
                if request.binary:
                    out[idx], length = encode_binary(document, request.binary)
                    processors[idx].add_response_property(BINARY_HEADER, str(length))
                    binary.add(idx)
                else:
                    out[idx] = json.dumps(document)
        for idx, error in batch.errors.items():
            if idx in batch.oip_grpc:
                out[idx] = json.dumps(
                    grpc_error(error.message, batch.oip_grpc[idx], self.context.model_name, self.model_version)
                )
            else:
                out[idx] = json.dumps(error.body())
            self.context.set_response_status(error.status, _reason_phrase(error.message), idx)
            for key, value in error.headers.items():
                processors[idx].add_response_property(key, value)
        # context.set_response_content_type(idx, ...) is this, two calls deeper
        for idx, rp in enumerate(processors):
            rp.add_response_property(CONTENT_TYPE, BINARY_CONTENT_TYPE if idx in binary else JSON)
        return out

    def _encode_outputs(self, batch: ParsedBatch, values: torch.Tensor, out: list, binary: set[int]) -> None:
        """:meth:`postprocess`'s answers for a model that is not one classifier (``values`` from :meth:`_outputs`).

        Metrics, drift and records follow the first output: its classes in ``batch.classes`` when it
        is a classification (with several outputs), else its values in ``batch.outputs`` (the
        per-class metrics do not apply).
        """
        head = values if len(self.signature) == 1 else values[:, : self.output["width"]]
        if self.output["kind"] == CLASSIFICATION:
            batch.classes = head.argmax(dim=1).tolist()
        else:
            batch.outputs = head
        rows = values.tolist()
        signature, version = self.signature, self.model_version
        explanations = batch.explanations
        first_row: dict[int, int] = {}
        for row, idx in enumerate(batch.rows):
            first_row.setdefault(idx, row)
            if explanations and idx in explanations:
                out[idx] = json.dumps(explanations[idx])
            elif idx not in batch.protocols:
                out[idx] = json.dumps(outputs_document(signature, rows[row], version))
        for idx, request in batch.protocols.items():
            if idx in batch.errors:  # an explain request (501): its error is its answer
                continue
            start = first_row[idx]
            document = outputs_answer(
                request, signature, rows[start : start + len(request.vectors)], self.context.model_name, version
            )
            if request.binary:
                out[idx], length = encode_binary(document, request.binary)
                self.context.request_processor[idx].add_response_property(BINARY_HEADER, str(length))
                binary.add(idx)
            else:
                out[idx] = json.dumps(document)


def _request_header(processor: Any, name: str) -> str | None:
    """A request header's value, its name matched in any case; None when the request has none.

    TorchServe keeps the client's spelling, and a proxy may lower it.
    """
    value = processor.get_request_property(name)
    if value is not None:
        return value
    lower = name.lower()
    for key, value in processor.get_request_properties().items():
        if isinstance(key, str) and key.lower() == lower:
            return value
    return None


def _json_parts(labels: list[str], version: str) -> tuple[list[str], str]:
    """The constant parts of an answer, so that postprocess only joins the probabilities.

    ``head[cls] + ", ".join(map(float.__repr__, probs)) + tail`` is byte for byte what
    ``json.dumps({"prediction": cls, "label": ..., "probabilities": probs, "model_version": ...})``
    writes for finite probabilities (json writes floats with ``float.__repr__``).
    """
    heads = [
        f'{{"prediction": {cls}, "label": {json.dumps(label)}, "probabilities": [' for cls, label in enumerate(labels)
    ]
    return heads, f'], "model_version": {json.dumps(version)}}}'


def _reason_phrase(message: str) -> str:
    """An HTTP reason phrase: printable ASCII on one line, bounded in length."""
    text = "".join(ch if 32 <= ord(ch) < 127 else "?" for ch in message)
    return text[:200]
