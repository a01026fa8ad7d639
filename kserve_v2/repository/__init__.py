"""The model repository: the models on disk, their configuration, and the model lifecycle (the
``ModelManager`` that satisfies ``kserve_v2.models.lifecycle``).

- ``manager``: ``ModelManager``: loads, reloads and unloads; per-model locks, draining unload.
- ``records``: what the manager knows of every model, and the questions asked of it (resolution, index).
- ``layout``: Triton's repository layout, read without loading anything: folders, versions, version policy.
- ``config``: ``config.pbtxt``: parse, auto-complete from the ONNX graph, validate.
- ``config_fields``: every ``ModelConfig`` field: acted on, refused or warned about.
- ``loader``: builds a model's servable versions with its backend, off the event loop.
- ``overrides``: RepositoryModelLoad parameters: the ``config`` override and ``file:<path>`` files.
- ``poller``: control mode ``poll``: rescans the repositories and follows what changed.
- ``stores``: Triton's ``s3://``, ``gs://`` and ``as://`` URLs, credentials, redaction.
- ``remote``: a remote repository's local mirror: listings, and model folders downloaded before they load.
"""
