"""The model's Open Inference Protocol signature: its tensors' names and datatypes, and its output kinds.

Shared by the handler's answers (:mod:`handler.protocols`) and the model metadata answer
(:mod:`rtserve.server.oip`), which runs in a small process of its own: nothing is imported here.
"""

INPUT_NAME = "features"
INPUT_DATATYPE = "FP32"
CLASS_OUTPUT = "class"
CLASS_DATATYPE = "INT64"
PROBABILITIES_OUTPUT = "probabilities"
PROBABILITIES_DATATYPE = "FP32"
OUTPUT_NAMES = (CLASS_OUTPUT, PROBABILITIES_OUTPUT)

#: The output kinds: what the handler answers for an output ``[N, width]``.
CLASSIFICATION, MULTI_LABEL, REGRESSION, EMBEDDING = "classification", "multi_label", "regression", "embedding"
KINDS = (CLASSIFICATION, MULTI_LABEL, REGRESSION, EMBEDDING)


def output_values(output: dict, answer: dict) -> list:
    """The numbers an answer of ``output``'s kind carries, in output column order.

    What a golden row records per kind: probabilities (classification, multi-label), values
    (regression), the vector (embedding).

    Raises:
        KeyError, TypeError: ``answer`` is not an answer of that kind.
    """
    kind = output["kind"]
    if kind == CLASSIFICATION:
        return list(answer["probabilities"])
    if kind == MULTI_LABEL:
        return [answer["probabilities"][label] for label in output["labels"]]
    if kind == REGRESSION:
        value = answer["prediction"]
        return list(value) if isinstance(value, list) else [value]
    return list(answer["embedding"])


def answer_numbers(outputs: list[dict], answer: dict) -> list:
    """The numbers an answer carries for the model's ``outputs`` (its signature), in column order.

    What a golden row records: one output's :func:`output_values`; several outputs' side by side,
    each from its own document in the answer's ``outputs`` (``{name: document}``).

    Raises:
        KeyError, TypeError: ``answer`` is not an answer of that signature.
    """
    if len(outputs) == 1:
        return output_values(outputs[0], answer)
    documents = answer["outputs"]
    return [v for output in outputs for v in output_values(output, documents[output["name"]])]


def first_answer(answer: dict) -> dict:
    """The first output's document of a several-output answer (``{"outputs": {name: document}}``).

    Any other answer as it is. The first output is the first key: the handler writes them in
    column order and JSON objects keep their order through Python's ``json``.
    """
    documents = answer.get("outputs")
    if isinstance(documents, dict) and documents:
        return next(iter(documents.values()))
    return answer


def first_golden(golden: dict, outputs: list[dict] | None) -> dict:
    """``golden`` as a one-output model's: its recorded answers cut to the first output's columns.

    Unchanged for one output (or ``rtserve-model/1``, None).
    """
    if not outputs or len(outputs) == 1 or not golden.get("outputs"):
        return golden
    width = outputs[0]["width"]
    return {**golden, "outputs": [row[:width] for row in golden["outputs"]]}


def golden_values(golden: dict) -> list:
    """The golden rows' recorded answers (``probabilities`` of a classifier, else ``outputs``)."""
    return golden.get("probabilities") or golden.get("outputs") or []


def target_names(output: dict) -> list[str]:
    """The names an explanation's ``target`` may take, in output column order.

    A classifier's or multi-label model's labels; a regression's ``targets`` (undeclared: the output's
    own name for one column, ``name[i]`` for several); none for an embedding (nothing to explain).
    """
    kind = output["kind"]
    if kind in (CLASSIFICATION, MULTI_LABEL):
        return list(output["labels"])
    if kind == REGRESSION:
        if output.get("targets"):
            return list(output["targets"])
        name, width = output["name"], output["width"]
        return [name] if width == 1 else [f"{name}[{i}]" for i in range(width)]
    return []
