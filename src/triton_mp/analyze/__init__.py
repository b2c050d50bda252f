"""``triton-mp analyze``: sweep a model's configuration against a running server and
recommend the best configs under the user's constraints (Model Analyzer's workflow).

A client of the server only: it talks to the HTTP/REST endpoint (repository API, config,
statistics, metrics), runs perf_analyzer (or the built-in load generator) and reads ``/proc``
for the server's processes. It imports ``common`` and ``_proto``, never a server role.
Pure pieces (``space``, ``search``, ``pareto``, ``checkpoint``) start no process.
"""
