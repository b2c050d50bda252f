"""Measuring one configuration against the server: its HTTP API, a server of our own, the
load (perf_analyzer or the built-in generator) and the server's processes in ``/proc``.
"""
