"""triton-mp: a Triton-compatible inference server built as a multi-process, shared-memory pool."""

__version__ = "0.1.0"
