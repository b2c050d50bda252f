"""The gRPC adapter of the frontend: KServe v2 / Triton ``inference.GRPCInferenceService``,
``grpc.health.v1.Health``, our ``triton_mp.admin.Admin`` and the restricted-protocol
interceptor. The only frontend modules that import ``grpc``."""
