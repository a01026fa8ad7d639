"""HTTP plumbing shared by every route.

- ``server``: uvicorn in the server's own event loop, TLS, 503s while draining.
- ``limits``: connection hygiene uvicorn lacks: header and body deadlines, header and chunk caps.
- ``access``: restricted API groups and the semantic routes' bearer token.
- ``body``: request bodies in (size limit, Content-Encoding), response bodies out (Accept-Encoding).
- ``json_io``: JSON text in and out: orjson first, the standard library's texts kept.
- ``metrics``: ASGI middleware: HTTP metrics by route pattern.
- ``routes``: ``guarded``: one exception handler per error envelope.
- ``status``: ``ErrorCode`` -> HTTP status, the one table, and the error body.
- ``timing``: the timing headers, the body's timing, and the trace id header.
"""
