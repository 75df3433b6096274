"""Observability: the metrics exporter, the request-latency histogram, the audit log, local Prometheus."""
