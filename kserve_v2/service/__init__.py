"""The one request path and its audiences. Every transport calls into this package; it imports no
transport.

- ``inference_service``: ``InferenceService``: the V2 inference RPCs (health, metadata, ModelInfer, ``model_stream``).
- ``extensions``: ``TritonExtensions``: Triton's repository, shared memory, trace and logging extensions.
- ``text_models``: ``TextModels``: the semantic routes' text models, one version per call.
- ``streaming``: every response of one request, as it comes (decoupled models).
- ``response_cache``: ``CountedCache`` (what every response cache shares) and ``ResponseCache``: Triton's
  local response cache, looked up by ``InferenceService``.
- ``redis_cache``: ``RedisResponseCache``: Triton's redis response cache, shared by replicas and servers.
"""
