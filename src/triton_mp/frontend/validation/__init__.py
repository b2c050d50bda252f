"""Triton's rules for an inference request, checked against the model's effective config.

Imported by the frontend only (``frontend.inference``); no transport, no shared memory
written. ``request.validate_request`` is the entry point; it applies, in Triton's order,
``parameters`` (reserved and custom request parameters), ``inputs`` (names, datatypes,
shapes, batch size, where each input's bytes are), then ``outputs`` (names, shared memory,
classification). Tensors in a client's registered shared memory are resolved by
``shared_memory``. Messages and codes follow core ``infer_request.cc`` (Normalize) and
server ``infer_handler.cc`` (triton.md §1.2, §4.3, §4.9).
"""
