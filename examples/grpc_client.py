"""Call TorchServe's gRPC inference API with stubs generated from the installed server's own protos.

    .venv/bin/python examples/grpc_client.py                  # the server of `make serve`
    .venv/bin/python examples/grpc_client.py --port 7070 --key-file .run/key_file.json

Sends examples/request.json to ``Predictions``, then the same features as a KServe v1 body, and
prints both answers. The stubs are generated once per installed TorchServe, from the .proto files in
its frontend jar (rtserve/grpc_stubs.py), into --stubs. Needs grpcio and grpcio-tools
(requirements-dev.txt, installed by make venv).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import grpc

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rtserve.client.grpc_stubs import generate  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=7070, help="grpc_inference_port")
    parser.add_argument("--key-file", type=Path, default=REPO / ".run" / "key_file.json")
    parser.add_argument("--model", default="realtime-classifier")
    parser.add_argument(
        "--stubs", type=Path, default=REPO / "build" / "grpc", help="cache directory of the generated stubs"
    )
    args = parser.parse_args()

    stubs = generate(args.stubs)
    key = json.loads(args.key_file.read_text())["inference"]["key"]
    metadata = (("authorization", f"Bearer {key}"),)  # TorchServe's token, as gRPC metadata
    features = json.loads((REPO / "examples" / "request.json").read_text())["features"]
    with grpc.insecure_channel(f"127.0.0.1:{args.port}") as channel:
        stub = stubs.inference_pb2_grpc.InferenceAPIsServiceStub(channel)
        for body in ({"features": features}, {"instances": [features]}):
            request = stubs.inference_pb2.PredictionsRequest(
                model_name=args.model, input={"data": json.dumps(body).encode()}
            )
            answer = stub.Predictions(request, metadata=metadata, timeout=10)
            sys.stdout.write(answer.prediction.decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
