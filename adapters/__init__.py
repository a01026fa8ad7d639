"""Text adapters: a tokenizer, an ONNX model run by the core's ONNX Runtime session, and
post-processing, served as repository models with a BYTES text interface.

Each module is a backend the core finds through the ``kserve_v2.backends`` entry points
(``pyproject.toml``): ``text_embedding`` (dense and multivector), ``text_sparse`` (SPLADE),
``text_rerank`` (cross-encoder) and ``text_extraction`` (token classification). A model selects
one with ``backend: "text_embedding"`` in its ``config.pbtxt``.
"""
