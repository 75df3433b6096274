"""A single-machine Kubernetes cluster on 127.0.0.1, built from the official Go modules."""
