"""The server's own settings, checked once from the command line: the flag groups (``server``),
``--metrics-config``, ``--trace-config`` and the restricted API groups. A model's ``config.pbtxt`` is
read by ``kserve_v2.repository.config``, not here."""
