"""Triton's python backend, run in the server's own process: the backend, a model's instances,
its configuration as Triton's JSON, tensors, and ``pb_utils`` (``triton_python_backend_utils``)."""
