"""Prometheus metrics: the endpoint, the rendering of Triton's families, and each source of
readings.
"""
