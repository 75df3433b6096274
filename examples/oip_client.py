"""Call rtserve with Triton's Open Inference Protocol client, its defaults unchanged.

    .venv/bin/python examples/oip_client.py                  # the server of `make serve`
    .venv/bin/python examples/oip_client.py --url 127.0.0.1:8080 --key-file .run/key_file.json
    .venv/bin/python examples/oip_client.py --token-file .run/pod/gateway-token   # `make pod`

Asks whether the model is ready and what it takes, then sends the features of
examples/request.json as an FP32 tensor of shape [1, 32]. With its defaults the client sends the
tensor as binary data after a JSON header and asks for every output as binary data; the server
answers in that form. Prints the answer's JSON header, then each output decoded. Needs
tritonclient[http] (requirements-dev.txt, installed by make venv).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import tritonclient.http as triton

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="127.0.0.1:8080", help="the inference address, host:port")
    parser.add_argument(
        "--key-file",
        type=Path,
        default=REPO / ".run" / "key_file.json",
        help="TorchServe's key file (its inference key is the token)",
    )
    parser.add_argument("--token-file", type=Path, help="a file holding the token (the pod's gateway)")
    parser.add_argument("--model", default="realtime-classifier")
    args = parser.parse_args()

    token = (
        args.token_file.read_text().split()[0]
        if args.token_file
        else json.loads(args.key_file.read_text())["inference"]["key"]
    )
    auth = {"Authorization": f"Bearer {token}"}
    features = json.loads((REPO / "examples" / "request.json").read_text())["features"]
    client = triton.InferenceServerClient(args.url)
    try:
        print("model ready:", client.is_model_ready(args.model, headers=auth))
        meta = client.get_model_metadata(args.model, headers=auth)
        print("metadata:", json.dumps(meta))
        (spec,) = meta["inputs"]
        tensor = triton.InferInput(spec["name"], [1, len(features)], spec["datatype"])
        tensor.set_data_from_numpy(np.array([features], dtype=np.float32))
        result = client.infer(args.model, [tensor], headers=auth)
        print("answer:", json.dumps(result.get_response()))
        for output in meta["outputs"]:
            print(f"{output['name']}:", json.dumps(result.as_numpy(output["name"]).tolist()))
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
