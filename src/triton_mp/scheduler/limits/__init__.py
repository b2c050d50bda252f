"""Triton's rate limiter (``--rate-limit execution_count``, ``instance_group.rate_limiter``):
which formed batch may start now (``rate_limiter``) and the gate the scheduler core holds
formed batches in until it may (``rate_gate``).
"""
