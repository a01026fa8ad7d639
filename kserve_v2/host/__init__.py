"""Facts about the machine and the process.

- ``cpus``: the CPUs this process may use (affinity, cgroup quota), for ``--workers auto``.
- ``allocator``: the process's memory allocator: tensor-sized buffers on transparent huge pages.
- ``ports``: listening ports that replica processes share (``SO_REUSEPORT``).
"""
