"""Kubernetes: deploy an overlay and verify the rollout with kubectl (the cluster targets call it)."""
