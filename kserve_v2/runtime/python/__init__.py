"""Triton's python backend: ``model.py`` defining ``TritonPythonModel``, run in the server's own
process or, with ``EXECUTION_MODE`` ``process`` or ``EXECUTION_ENV_PATH``, in stub processes.

- ``backend``: the ``python`` backend: opens a version, auto-completes, creates its instances.
- ``model``: ``PythonModel``: ``execute`` on an instance thread, the requests' senders, ``PythonBatching``.
- ``config``: ``pb_utils.ModelConfig``: the configuration as Triton's JSON, ``auto_complete_config``.
- ``tensors``: ``Tensor``, ``InferenceResponse``, ``TritonError``, and their conversion to and from the wire codec.
- ``pb_utils``: ``triton_python_backend_utils``, the module model code imports: requests, senders, BLS, Logger,
  and ``ModelHost``, its one seam to the server.
- ``in_process``: ``InProcessHost``, the ``ModelHost`` of model code in the server's process (the server's own calls).
- ``executing``: what both sides of the seam share: importing ``model.py``, running as a host, the error texts.
- ``process``: the server's side of a stub process: ``ProcessModel``, ``ProcessInstance`` proxies.
- ``stub``: the stub process's main loop (``python -m kserve_v2.runtime.python.stub``) and ``StubHost``,
  the ``ModelHost`` that asks the server.
- ``protocol``: the typed messages between the server and a stub, and the ``Link`` both sides talk over.
- ``shm``: the shared memory region tensors travel through between the server and a stub.
- ``environments``: ``EXECUTION_ENV_PATH``: custom execution environments, unpacked once.
"""
