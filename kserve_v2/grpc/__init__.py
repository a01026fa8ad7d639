"""The gRPC front end: ``GRPCInferenceService`` and grpc.health.v1 on a grpc.aio server, every RPC a
delegation to ``kserve_v2.service``.

- ``server``: builds the grpc.aio server: options, servicers, port binding, TLS.
- ``servicer``: the servicer, pure delegation to ``InferenceService``; ModelInfer and ModelStreamInfer in bytes.
- ``registration``: every handler wrapped once (failures become a status); the raw methods, with no (de)serializer.
- ``parsing``: bytes that are not valid protobuf become an ``Unparsable`` marker.
- ``status``: ``ErrorCode`` -> ``grpc.StatusCode``, the one table.
- ``health``: grpc.health.v1 with a drain that ends Watch streams.
- ``access``: ``--grpc-restricted-protocol``: an interceptor, installed only when a group is restricted.
"""
