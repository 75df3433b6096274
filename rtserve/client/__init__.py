"""Clients of TorchServe's APIs: REST (inference, management, metrics) and gRPC stubs."""
