"""A loaded model version and the lifecycle seam through which the service reads and drives the
repository's models.

- ``version``: ``ModelVersion``, and the scheduler its configuration picks (``open_version``).
- ``lifecycle``: ``ModelLifecycle``, ``Records``, ``State``: the interfaces the repository implements.
- ``warmup``: Triton's ``model_warmup``: each instance runs the samples before the version is handed out.
"""
