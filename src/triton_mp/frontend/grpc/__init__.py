"""The gRPC adapter of the frontend: KServe v2 / Triton ``inference.GRPCInferenceService``
(``servicer``, ``stream``, with ``messages`` and ``wire`` for the protos and their tensor
bytes), ``grpc.health.v1.Health``, our ``triton_mp.admin.Admin`` (``admin_service``) and the
restricted-protocol interceptor. With ``frontend.main``, which builds the server, the only
frontend modules that import ``grpc``."""
