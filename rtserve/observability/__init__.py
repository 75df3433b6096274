"""Observability: the metrics exporter beside TorchServe, the request-latency histogram, local Prometheus."""
