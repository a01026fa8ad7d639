"""The semantic routes: SIE's ``/v1/encode``, ``/v1/score``, ``/v1/extract``, OpenAI's
``/v1/embeddings``, the rerank routes and ``/v1/tokenize``, each transcoded onto the service's text
model calls.

- ``sie``: ``SieRoutes``: SIE's encode, score, extract and health routes.
- ``sie_codec``: SIE's bodies and errors: msgpack / JSON negotiation, schema checks.
- ``sie_metrics``: SIE's metric families, from the core's per-API totals.
- ``embeddings``: OpenAI's ``/v1/embeddings`` and ``/v1/models``, and ``/v1/tokenize``.
- ``openai_codec``: bodies and errors of the OpenAI-shaped routes.
- ``rerank``: Cohere's ``/v1/rerank`` and ``/v2/rerank``, Jina's and vLLM's ``/rerank``.
- ``text_calls``: a semantic request as one text model call, and SIE's ModelInfo.
- ``token_ids``: OpenAI's ``input`` forms (token ids included) as texts.
- ``body_schemas``: the JSON Schemas of the semantic bodies (also in the OpenAPI document).
"""
