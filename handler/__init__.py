"""rtserve's TorchServe handler package.

Everything here except ``rtserve_handler`` is free of TorchServe imports, so it can be
tested and reused (training, the client, benchmarks) without a server.
"""
