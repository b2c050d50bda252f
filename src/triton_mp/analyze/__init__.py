"""``triton-mp analyze``: sweep a model's configuration against a running server and
recommend the best configs under the user's constraints (Model Analyzer's workflow).

A client of the server only: it talks to the HTTP/REST endpoint (repository API, config,
statistics, metrics), runs perf_analyzer (or the built-in load generator) and reads ``/proc``
for the server's processes. It imports ``common`` and ``_proto``, never a server role.

``runner`` (the sweep's shell), ``options`` (its command line) and ``report`` (tables, config
files, HTML, JSON) sit over two sub-packages, imported one way (``probe`` uses ``sweep``):

- ``sweep``: the pure pieces, which start no process: ``space`` (the configurations to try),
  ``results`` (what one measurement found), ``pareto`` (constraints and objectives),
  ``search`` (which configuration next), ``settings`` and ``checkpoint``.
- ``probe``: measuring against the server: ``client`` (its HTTP API), ``launch`` (a server
  of our own), ``loadgen`` (the built-in load generator), ``measure`` (one measurement, with
  perf_analyzer or the load generator) and ``procs`` (the server's processes in ``/proc``).
"""
