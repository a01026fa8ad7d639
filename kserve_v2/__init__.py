"""kserve_v2: a gRPC-first KServe V2 / Open Inference Protocol server on ONNX Runtime.

The composition root sits here; every other module lives in the subpackage of its concern (the
import layers: ``[tool.importlinter]`` in pyproject.toml; the map: docs/architecture.md).

- ``__main__``: ``python -m kserve_v2`` runs the command line.
- ``cli``: ``kserve-v2 serve``: flags and environment variables -> ``Settings``; one ``App``, or the supervisor.
- ``app``: ``App``, the composition root: builds and wires everything, runs startup and the SIGTERM drain.
"""

__version__ = "0.1.0"
