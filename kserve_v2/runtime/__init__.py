"""The built-in backends (``kserve_v2.backend.find`` loads them by module name).

- ``onnx``: the ``onnxruntime`` backend: ONNX Runtime sessions and the model they execute, model file checks.
- ``device``: quiet CUDA detection: is there a GPU ONNX Runtime's CUDA execution provider can use.
- ``placement``: where an ONNX model's instances run, and the CUDA execution provider's options.
- ``python``: the ``python`` backend, Triton's python-backend models (see its package).
"""
