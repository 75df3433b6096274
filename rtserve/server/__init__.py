"""One TorchServe: its config, start and stop, readiness and warm-up, drain, the pod's probes, the OIP model routes."""
