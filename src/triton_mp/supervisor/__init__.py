"""The supervisor process: ``triton-mp start``.

``main`` (bootstrap, signals, ordered shutdown) over two sub-packages, imported one way
(``models`` uses ``processes``, never the reverse):

- ``processes``: the server's child processes and the IPC objects between them:
  ``children`` (the process table: spawn, start handshake, watch, restart), ``child_entry``
  (every child's spawn target), ``health`` (heartbeat judging), ``wiring`` (the only creator
  and unlinker of IPC objects), ``instances`` (wiring and starting worker instances),
  ``bls_wiring`` (pure BLS ring plans), ``frontend_link`` (the frontends' control pipes) and
  ``frontend_restart`` (a dead frontend's place taken).
- ``models``: model control (Triton's model repository API and ``--load-model``):
  ``model_control`` (the change thread) with ``load_requests`` (reading a model to load),
  ``model_changes`` (the pure change planner), ``change_effects`` (a plan's effects),
  ``served_models`` (what is served), ``ensemble_deps`` (ensembles and their steps) and
  ``bls_control`` (``pb_utils.load_model`` from python models).

Nothing is imported here: every child process imports this package first (its spawn target
is ``supervisor.processes.child_entry``), and must not pay for the supervisor's own imports.
"""
