"""Streaming on Apache Kafka: the stream consumer, and the local single-node broker (make kafka)."""
