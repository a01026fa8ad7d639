"""The V2 / Triton REST routes: inference with JSON and binary tensor data, metadata, health,
Triton's extensions beside inference, and the generate extension.

- ``rest``: ``V2Routes``: every V2 route a transcoder onto the service's calls; the ``{"error": ...}`` envelope.
- ``json_tensors``: V2 JSON bodies (with the binary tensor extension) <-> ModelInferRequest/Response.
- ``raw_binary``: raw binary requests (``Inference-Header-Content-Length: 0``): the body is the one input.
- ``generate``: Triton's generate extension: ``/generate`` and ``/generate_stream`` (Server-Sent Events).
- ``triton_extensions``: trace, logging and CUDA shared memory routes.
"""
