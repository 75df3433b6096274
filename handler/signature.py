"""The model's Open Inference Protocol signature: its tensors' names and datatypes.

Shared by the handler's answers (:mod:`handler.protocols`) and the model metadata answer
(:mod:`rtserve.oip`), which runs in a small process of its own: nothing is imported here.
"""

INPUT_NAME = "features"
INPUT_DATATYPE = "FP32"
CLASS_OUTPUT = "class"
CLASS_DATATYPE = "INT64"
PROBABILITIES_OUTPUT = "probabilities"
PROBABILITIES_DATATYPE = "FP32"
OUTPUT_NAMES = (CLASS_OUTPUT, PROBABILITIES_OUTPUT)
