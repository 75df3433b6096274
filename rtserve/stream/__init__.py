"""Streaming on Apache Kafka: the local single-node broker (make kafka) and its Admin API calls."""
