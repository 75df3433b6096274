"""One TorchServe instance: its config, start and stop, readiness, drain and the pod's probes."""
