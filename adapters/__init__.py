"""Text adapters: a tokenizer, an ONNX model run by the core's ONNX Runtime session, and
post-processing, served as repository models with a BYTES text interface.

Each backend is found through the ``kserve_v2.backends`` entry points (``pyproject.toml``); a
model selects one with ``backend: "text_embedding"`` (or another) in its ``config.pbtxt``.

- ``base``: ``TextAdapter``: the contract -> V2 interface; pre (tokenize) -> ONNX Runtime -> post.
- ``batching``: ``TextBatching``: the texts of several requests as one batch, split back per request.
- ``inputs``: a text model's request: texts, string, integer and boolean parameters, SIE's instruction prefix.
- ``tokenizer``: the ``tokenizers`` library around a model's ``tokenizer.json``.
- ``embedding``: ``text_embedding``: dense embeddings, multivectors, bi-encoder scores.
- ``sparse``: ``text_sparse``: SPLADE sparse embeddings and dot-product scores.
- ``rerank``: ``text_rerank``: a cross-encoder scoring (query, text) pairs.
- ``extraction``: ``text_extraction``: token classification decoded into character spans.
"""
