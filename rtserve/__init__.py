"""rtserve: train, archive, serve and operate a real-time PyTorch classifier on TorchServe."""

__all__ = ["__version__"]
__version__ = "0.1.0"
