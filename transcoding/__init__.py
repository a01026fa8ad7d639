"""The HTTP front end: HTTP transcoded onto the same ``InferenceService`` calls the gRPC servicer makes.

- ``app``: every route of the HTTP port in one ASGI application (``build_app``), and the metrics port's.
- ``openapi``: the OpenAPI 3 document (``/api-doc/openapi.json``, shown at ``/docs``).
- ``status_page``: ``/ws/status`` and the ``/status`` page.
- ``v2``: the V2 / Triton REST routes (see its package).
- ``semantic``: SIE's, OpenAI's and the rerank routes (see its package).
- ``http``: the plumbing every route shares (see its package).
"""
