"""What the tests and the benchmarks share: a TorchServe on free ports, a faithful worker context."""
