"""One TorchServe: its config, start and stop, readiness, drain, the pod's probes, the OIP model routes."""
