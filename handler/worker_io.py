"""TorchServe 0.12's Python worker, made lighter per batch (installed by the handler, per worker).

:func:`install` serves the frontend's frames from one ``recv()`` (:class:`BufferedReader`); :func:`install_lean`
replaces the per-batch log call, ``PredictionTime``, answer encoder and batch parser. Each part applies only over
the pinned 0.12.0 source (:data:`PINNED_SHA256`, :data:`LEAN_PINS`), else logs why; frames stay byte for byte.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import struct
import sys
import weakref
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

#: Bytes asked for per ``recv()``: a batch of 32 requests is about 40 KiB.
CHUNK = 65536
#: SHA-256 of ``inspect.getsource(ts.protocol.otf_message_handler._retrieve_buffer)`` in 0.12.0.
PINNED_SHA256 = "aa64bcd2010ef54923e4e97c528f525f5a2348f852435a929e04efe497cf135a"
PINNED_VERSION = "0.12.0"
#: SHA-256 of ``inspect.getsource`` in TorchServe 0.12.0 of each function the lean worker loop
#: replaces or relies on.
LEAN_PINS = {
    "retrieve_msg": "3b7f3c97cccd94d80b44321f9e891dc4feaf738c4f881d39399195c6ac05f5f6",
    "create_predict_response": "728708fe6b98746510a8d31007f5aa364dcd01436fddfdd460a7dc7540cedea6",
    "encode_response_headers": "7695ae89400c8a22674792ae486b51cf4f8c4ff778b36a8e7b30b23634e8bf90",
    "Service.predict": "630da7c260bdab9128733a010a84980ff2cd89fb61c8bf5df98a6b846a642fd0",
    "MetricCacheAbstract.add_time": "36383cbc1e4ca2f6856daf0e3a1bebe51aee7c5cf4296ff72a071a3712da9488",
    "_retrieve_inference_msg": "17462ccb5c9d8b05bce3d4c2d295686921193bb77814d6867ea58b74d9783dd1",
    "_retrieve_request": "211b8458e989e9b735a1935ba16432eb63ddf0307d7568d330b2ec1573b9291a",
    "_retrieve_reqest_header": "1e0346dea0010537ebaedca7b25f399bbfa12074304d8144ee5baa14e6fbefe0",
    "_retrieve_input_data": "21a9ed178e18853f8d35ccb505bb7ed518bb77bce3fa2847408b0e794cd43647",
}
#: The worker script TorchServe's frontend runs (as ``__main__``).
WORKER_SCRIPT = os.path.join("ts", "model_service_worker.py")


class BufferedReader:
    """``_retrieve_buffer(conn, length)`` with a read-ahead buffer per connection."""

    def __init__(self) -> None:
        self._state: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # The last connection and its state: a worker reads from one socket, and a weak
        # dictionary lookup per field costs more than the read itself.
        self._last: tuple[Callable[[], Any], list] = (lambda: None, [])

    def _state_of(self, conn) -> list:
        last_conn, state = self._last
        if last_conn() is not conn:
            state = self._state.get(conn)
            if state is None:
                state = self._state[conn] = [bytearray(), 0]  # received bytes, read offset
            self._last = (weakref.ref(conn), state)
        return state

    def __call__(self, conn, length: int) -> bytearray:
        state = self._state_of(conn)
        buf, pos = state
        while len(buf) - pos < length:
            if pos:
                del buf[:pos]
                pos = 0
            _receive(conn, buf, max(CHUNK, length - len(buf)))
        out = buf[pos : pos + length]
        pos += length
        if pos == len(buf):
            buf.clear()
            pos = 0
        state[1] = pos
        return out

    def inference_msg(self, conn) -> list[dict]:
        """An inference command's batch (the bytes after its command byte), parsed in place.

        The very list ``_retrieve_inference_msg`` of TorchServe 0.12.0 returns (per request
        ``requestId``, ``headers`` of ``name``/``value``, ``parameters`` of ``name``,
        ``contentType`` and ``value``, a JSON or text value decoded unless
        ``TS_DECODE_INPUT_REQUEST`` says otherwise), without a function call per field. A message
        not yet wholly received is parsed again from its start once more bytes came; values are
        decoded once it is whole.
        """
        state = self._state_of(conn)
        buf = state[0]
        while True:
            try:
                batch, pos = _parse_batch(buf, state[1])
                break
            except (struct.error, _Short):
                if state[1]:
                    del buf[: state[1]]
                    state[1] = 0
                _receive(conn, buf, CHUNK)
        if pos == len(buf):
            buf.clear()
            pos = 0
        state[1] = pos
        decode = os.environ.get("TS_DECODE_INPUT_REQUEST") in (None, "true")
        for request in batch:
            request["parameters"] = [_parameter(*fields, decode) for fields in request["parameters"]]
        return batch


def _receive(conn, buf: bytearray, size: int) -> None:
    """Append up to ``size`` received bytes to ``buf``.

    A closed connection ends the worker, as TorchServe's own reader does.
    """
    pkt = conn.recv(size)
    if not pkt:
        logging.info("Frontend disconnected.")
        sys.exit(0)
    buf += pkt


class _Short(Exception):
    """The buffer ends inside the message."""


def _parse_batch(buf: bytearray, pos: int) -> tuple[list[dict], int]:
    """The batch starting at ``pos`` in ``buf``, and the offset after it.

    Each request's parameters are still their (name, content type, value) fields (see
    :meth:`BufferedReader.inference_msg`).

    Raises:
        struct.error: ``buf`` ends first (inside a length).
        _Short: ``buf`` ends first (inside a field).
    """
    batch = []
    while True:
        ids, pos = _groups(buf, pos, 1, 1)
        if not ids:
            return batch, pos
        headers, pos = _groups(buf, pos, 2)
        parameters, pos = _groups(buf, pos, 3)
        batch.append(
            {
                "requestId": ids[0][0],
                "headers": [{"name": name, "value": value} for name, value in headers],
                "parameters": parameters,
            }
        )


def _groups(buf: bytearray, pos: int, width: int, most: int = -1) -> tuple[list[list], int]:
    """Groups of ``width`` length-prefixed fields from ``pos``, and the offset after them.

    Reads until a -1 length (consumed) or ``most`` groups.
    """
    unpack, n, out = _UNPACK_INT, len(buf), []
    while len(out) != most:
        (length,) = unpack(buf, pos)
        pos += 4
        if length == -1:
            break
        fields = []
        while True:
            end = pos + length
            if end > n:
                raise _Short
            fields.append(buf[pos:end])
            pos = end
            if len(fields) == width:
                break
            (length,) = unpack(buf, pos)
            pos += 4
        out.append(fields)
    return out, pos


def _parameter(name: bytearray, content_type: bytearray, value: bytearray, decode: bool) -> dict:
    """A request's parameter as TorchServe's ``_retrieve_input_data`` gives it."""
    kind = content_type.decode("utf-8")
    out = {"name": name.decode("utf-8"), "contentType": kind, "value": value}
    if decode and kind == "application/json":
        try:
            out["value"] = json.loads(value.decode("utf-8"))
        except Exception:  # noqa: BLE001 - as TorchServe: the bytes go on, with a warning
            logging.warning("undecodable JSON input: passed on as bytes", exc_info=True)
    elif decode and kind.startswith("text"):
        try:
            out["value"] = value.decode("utf-8")
        except UnicodeDecodeError:
            logging.warning("undecodable text input: passed on as bytes", exc_info=True)
    return out


_UNPACK_INT = struct.Struct("!i").unpack_from


def install() -> bool:
    """Put :class:`BufferedReader` in place of TorchServe's reader (once per process).

    Returns:
        Whether the buffered reader is in place.
    """
    import ts
    from ts.protocol import otf_message_handler as otf

    if isinstance(otf._retrieve_buffer, BufferedReader):
        return True
    try:
        source = inspect.getsource(otf._retrieve_buffer)
    except (OSError, TypeError) as exc:
        source = f"(no source: {exc})"
    digest = hashlib.sha256(source.encode()).hexdigest()
    if ts.__version__ != PINNED_VERSION or digest != PINNED_SHA256:
        logger.warning(
            "buffered worker reads OFF: TorchServe %s's reader (SHA-256 %s) is not the "
            "pinned %s one; its own reads stay",
            ts.__version__,
            digest,
            PINNED_VERSION,
        )
        return False
    otf._retrieve_buffer = BufferedReader()
    return True


# --------------------------------------------------------------------------- the lean worker loop


def _sha256(obj: Any) -> str:
    try:
        source = inspect.getsource(obj)
    except (OSError, TypeError) as exc:
        source = f"(no source: {exc})"
    return hashlib.sha256(source.encode()).hexdigest()


def _unpinned(version: str, found: dict[str, Any]) -> list[str]:
    """The names of ``found`` (name -> function) whose source is not the pinned one."""
    if version != PINNED_VERSION:
        return [f"TorchServe {version}"]
    return [name for name, obj in found.items() if _sha256(obj) != LEAN_PINS[name]]


def retrieve_msg(conn):
    """``ts.protocol.otf_message_handler.retrieve_msg`` of 0.12.0 without its per-batch log call."""
    from ts.protocol import otf_message_handler as otf

    cmd = otf._retrieve_buffer(conn, 1)
    if cmd == otf.LOAD_MSG:
        msg = otf._retrieve_load_msg(conn)
    elif cmd == otf.PREDICT_MSG:
        msg = otf._retrieve_inference_msg(conn)
    else:
        raise ValueError(f"Invalid command: {cmd}")
    return cmd, msg


_INT = struct.Struct("!i").pack
_END = _INT(-1)


def _predict_response_for(original: Callable) -> Callable:
    """:func:`predict_response` falling back to ``original`` (TorchServe's encoder)."""

    def predict_response(ret, req_id_map, message, code, context=None, ts_stream_next=False):
        """``create_predict_response``'s frame, byte for byte, for a batch's ``str`` or ``bytes`` answers.

        Anything else goes to TorchServe's own encoder.
        """
        if (
            context is None
            or ts_stream_next is not False
            or context.stopping_criteria
            or not isinstance(ret, list)
            or not all(type(v) is str or isinstance(v, (bytes, bytearray)) for v in ret)
        ):
            return original(ret, req_id_map, message, code, context, ts_stream_next)
        buf = message.encode("utf-8")
        parts = [_INT(code), _INT(len(buf)), buf]
        processors = context.request_processor
        for idx in req_id_map:
            req_id = req_id_map.get(idx).encode("utf-8")
            parts += (_INT(len(req_id)), req_id)
            rp = processors[idx]
            headers = rp.get_response_headers()
            if "true" == headers.get("ts_stream_next"):
                headers["ts_stream_next"] = "false"
            content_type = headers.get("content-type")
            if content_type is None or len(content_type) == 0:
                parts.append(_INT(0))
            else:  # the length of the str, as TorchServe writes it
                parts += (_INT(len(content_type)), content_type.encode("utf-8"))
            sc, phrase = rp.get_response_status_code(), rp.get_response_status_phrase()
            http_phrase = phrase if phrase is not None else ""
            parts += (
                _INT(sc if sc is not None else 200),
                _INT(len(http_phrase)),
                http_phrase.encode("utf-8"),
                _INT(len(headers)),
            )
            for k, v in headers.items():
                k, v = k.encode("utf-8"), v.encode("utf-8")
                parts += (_INT(len(k)), k, _INT(len(v)), v)
            val = ret[idx]
            if type(val) is str:
                val = val.encode("utf-8")
            parts += (_INT(len(val)), val)
        parts.append(_END)
        return bytearray(b"".join(parts))

    predict_response.original = original
    return predict_response


def _inference_msg_for(original: Callable) -> Callable:
    """A batch parser that reads through the worker's :class:`BufferedReader`, else ``original``.

    The reader is whichever is in place when a batch comes; ``original`` is TorchServe's.
    """
    from ts.protocol import otf_message_handler as otf

    def inference_msg(conn):
        reader = otf._retrieve_buffer
        if isinstance(reader, BufferedReader):
            return reader.inference_msg(conn)
        return original(conn)

    inference_msg.original = original
    return inference_msg


class QuietPredictionTime:
    """A metrics cache's ``add_time`` that skips TorchServe's per-batch ``PredictionTime`` when unseen.

    It skips it while the metric logger drops INFO records (its only output is an INFO line), and
    passes every other metric to the cache's own ``add_time``.
    """

    def __init__(self, add_time: Callable, name: str, metric_logger: logging.Logger) -> None:
        self.add_time, self.name, self.logger = add_time, name, metric_logger

    def __call__(self, name: str, value: Any, *args: Any, **kwargs: Any) -> Any:
        if name == self.name and not self.logger.isEnabledFor(logging.INFO):
            return None
        return self.add_time(name, value, *args, **kwargs)


def install_lean(context: Any, metric_logger: str) -> list[str]:
    """Put the lean worker loop's parts in place, each only over TorchServe 0.12.0's own code.

    :func:`retrieve_msg` without the per-batch log call (``__main__``'s reference too),
    ``predict_response`` (the same frame in one join), :class:`QuietPredictionTime`, and the
    in-place batch parser (:meth:`BufferedReader.inference_msg`, with the buffered reads only).
    What does not apply keeps TorchServe's code and is logged.

    Args:
        context: the worker's ``ts.context.Context`` (its metrics cache gets
            :class:`QuietPredictionTime`).
        metric_logger: the logger of TorchServe's metric lines.

    Returns:
        The parts in place: ``retrieve_msg``, ``predict_response``, ``prediction_time``,
        ``inference_msg``.
    """
    import ts
    import ts.service as service
    from ts.metrics.metric_cache_abstract import MetricCacheAbstract
    from ts.protocol import otf_message_handler as otf

    done = []
    main = sys.modules.get("__main__")
    script = getattr(main, "__file__", "") or ""
    current = otf.retrieve_msg
    if current is retrieve_msg:
        done.append("retrieve_msg")
    else:
        bad = _unpinned(ts.__version__, {"retrieve_msg": current})
        if bad:
            logger.warning(
                "lean worker: per-batch log call kept: %s is not the pinned %s source", ", ".join(bad), PINNED_VERSION
            )
        elif not script.endswith(WORKER_SCRIPT) or getattr(main, "retrieve_msg", None) is not current:
            logger.warning(
                "lean worker: per-batch log call kept: not in TorchServe's worker script (__main__ is %s)",
                script or "interactive",
            )
        else:
            otf.retrieve_msg = main.retrieve_msg = retrieve_msg
            done.append("retrieve_msg")
    current = service.create_predict_response
    if getattr(current, "original", None) is otf.create_predict_response:
        done.append("predict_response")
    else:
        bad = _unpinned(
            ts.__version__,
            {
                "create_predict_response": current,
                "encode_response_headers": otf.encode_response_headers,
                "Service.predict": service.Service.predict,
            },
        )
        if bad or current is not otf.create_predict_response:
            logger.warning(
                "lean worker: TorchServe's response encoder kept: %s is not the pinned %s source",
                ", ".join(bad) or "create_predict_response",
                PINNED_VERSION,
            )
        elif os.getenv("LOCAL_RANK", "0") != "0":
            logger.warning("lean worker: TorchServe's response encoder kept: LOCAL_RANK is %s", os.getenv("LOCAL_RANK"))
        else:
            service.create_predict_response = _predict_response_for(current)
            done.append("predict_response")
    metrics = getattr(context, "metrics", None)
    add_time = getattr(metrics, "add_time", None)
    if isinstance(add_time, QuietPredictionTime):
        done.append("prediction_time")
    elif add_time is not None:
        bad = _unpinned(
            ts.__version__,
            {"Service.predict": service.Service.predict, "MetricCacheAbstract.add_time": MetricCacheAbstract.add_time},
        )
        if bad or getattr(add_time, "__func__", None) is not MetricCacheAbstract.add_time:
            logger.warning(
                "lean worker: PredictionTime kept: %s is not the pinned %s source",
                ", ".join(bad) or "the metrics cache's add_time",
                PINNED_VERSION,
            )
        else:
            metrics.add_time = QuietPredictionTime(
                add_time, service.PREDICTION_METRIC, logging.getLogger(metric_logger)
            )
            done.append("prediction_time")
    reader, current = otf._retrieve_buffer, otf._retrieve_inference_msg
    if getattr(current, "original", None) is not None:
        done.append("inference_msg")
    elif not isinstance(reader, BufferedReader):
        logger.warning("lean worker: TorchServe's batch parser kept: the buffered reads are off")
    else:
        bad = _unpinned(
            ts.__version__,
            {
                name: getattr(otf, name)
                for name in (
                    "_retrieve_inference_msg",
                    "_retrieve_request",
                    "_retrieve_reqest_header",
                    "_retrieve_input_data",
                )
            },
        )
        if bad:
            logger.warning(
                "lean worker: TorchServe's batch parser kept: %s is not the pinned %s source",
                ", ".join(bad),
                PINNED_VERSION,
            )
        else:
            otf._retrieve_inference_msg = _inference_msg_for(current)
            done.append("inference_msg")
    return done
