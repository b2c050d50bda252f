"""The supervisor process: ``triton-mp start``.

``main`` (bootstrap, signals, ordered shutdown), ``children`` (the process table: spawn,
start handshake, watch, restart), ``child_entry`` (every child's spawn target), ``health``
(heartbeat judging), ``wiring`` (the only creator and unlinker of IPC objects),
``model_control`` (the change thread) with ``load_requests`` (reading a model to load),
``model_changes`` (the pure change planner), ``instances`` (wiring and starting worker
instances), ``bls_wiring`` (pure BLS ring plans) and ``frontend_link`` (the frontends'
control pipes).

Nothing is imported here: every child process imports this package first (its spawn target
is ``supervisor.child_entry``), and must not pay for the supervisor's own imports.
"""
