"""The semantic routes: SIE's ``/v1/encode``, ``/v1/score``, ``/v1/extract``, OpenAI's
``/v1/embeddings``, the rerank routes and ``/v1/tokenize``, each transcoded onto the service's text
model calls."""
