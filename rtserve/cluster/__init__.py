"""A single-machine Kubernetes cluster on 127.0.0.1 (etcd, API server, controllers, scheduler) built from the official Go modules."""
