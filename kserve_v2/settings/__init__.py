"""The server's own settings, checked once from the command line. A model's ``config.pbtxt`` is read
by ``kserve_v2.repository.config``, not here.

- ``server``: ``Settings`` and its flag groups, frozen data that checks itself.
- ``metrics_config``: ``--metrics-config``.
- ``trace_config``: ``--trace-config``: the trace mode and startup trace settings.
- ``restrictions``: ``--grpc-restricted-protocol`` / ``--http-restricted-api``: the restricted API groups.
- ``cache_config``: ``--cache-config``, ``--cache-directory``, ``--response-cache-byte-size``.
- ``rate_limit``: ``--rate-limit``, ``--rate-limit-resource``.
- ``backend_config``: ``--backend-config``: the backends' settings (python, onnxruntime, default-max-batch-size).
"""
