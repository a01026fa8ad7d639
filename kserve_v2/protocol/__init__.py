"""The V2 / Triton data model. Imports only the codec and the generated messages.

- ``errors``: transport-neutral errors and their ``ErrorCode``; which may be retried (``retry_after``).
- ``reserved``: the request parameters Triton's extensions reserve, and Triton's texts several layers answer with.
- ``datatypes``: the one datatype table: V2 <-> numpy <-> config enum <-> ONNX <-> contents field.
- ``tensors``: tensor bytes <-> numpy arrays: raw contents, typed contents, BYTES framing.
- ``model_spec``: a model's tensor interface: ``TensorDeclaration``, and ``ModelSpec`` from its ModelConfig.
- ``json_pb``: protobuf messages as Triton's JSON.
- ``statistics``: Triton's per-version statistics, and ``RequestReport``, what one request reports.
"""
