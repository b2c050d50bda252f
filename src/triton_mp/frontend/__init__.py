"""The frontend process role: client requests in (gRPC, HTTP/REST), answers out.

Layout, core first (transport-free, ``tests/unit/test_layering.py`` checks it):

- ``request``: the inference request as the core takes it; ``validation/``: Triton's rules
  (``parameters``, ``inputs``, ``outputs``, ``shared_memory``, ``request``);
- ``inference``: the one submit path (``submit -> Ticket``) and the drain; ``ticket``: a
  submitted request's responses; ``pending``: what the frontend waits on;
- ``model_table``, ``client_shm``, ``server_api``, ``repository_api``, ``stats_api``,
  ``restricted``; ``api``: all of them, as the transports see them;
- ``control``: the supervisor's pipe; ``inbox``: answers and model-table updates arriving.

Adapters: ``grpc/`` (servicer, stream, messages, wire, admin_service, interceptor), ``http/``
(routes, infer_codec, json_tensors), ``kserve`` (the answers' ``inference.*`` protos), and
``metrics`` (Prometheus). ``main`` is the process entry (``run_frontend``).
"""
