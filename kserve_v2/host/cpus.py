"""The CPUs this process may use, for ``--workers auto``: its CPU affinity, capped by the cgroup's
CPU quota where one is set (a Kubernetes CPU limit).

Sources: Linux ``sched_getaffinity(2)``; cgroup v2's ``cpu.max`` ("$MAX $PERIOD", ``max`` when
unlimited) and cgroup v1's ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (-1 when unlimited), read
for this process's own cgroup from ``/proc/self/cgroup``.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def usable_cpus(cgroup_root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")) -> int:
    """CPUs this process may run on, at least 1: the affinity mask's size, at most the cgroup's
    quota rounded up (a limit of 1.5 CPUs gives 2)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cgroup_quota(cgroup_root, proc_cgroup)
    if quota is not None:
        cpus = min(cpus, math.ceil(quota))
    return max(cpus, 1)


def cgroup_quota(cgroup_root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")) -> float | None:
    """The CPU quota of this process's cgroup in CPUs, or None when there is none (or no cgroup
    file can be read)."""
    for folder in _own_cgroups(cgroup_root, proc_cgroup):
        v2 = _read(folder / "cpu.max")
        v1 = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
        parts = v2.split() if v2 is not None else [v1[0], v1[1]] if v1[0] is not None and v1[1] is not None else None
        if parts is None:
            continue
        try:
            quota, period = float(parts[0]), float(parts[1])  # v2 "max" and v1 -1: unlimited
        except (ValueError, IndexError):
            return None
        return quota / period if quota > 0 and period > 0 else None
    return None


def _own_cgroups(root: Path, proc_cgroup: Path) -> list[Path]:
    """The folders that may hold this process's CPU limits: its own cgroup's (v2 "0::/path", v1
    "N:cpu,cpuacct:/path"), then the mount root (inside a container the cgroup is the root)."""
    folders = []
    text = _read(proc_cgroup) or ""
    for line in text.splitlines():
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        relative = path.lstrip("/")
        if controllers == "":
            folders.append(root / relative)
        elif "cpu" in controllers.split(","):
            folders += [root / controllers / relative, root / "cpu" / relative]
    return [*folders, root, root / "cpu", root / "cpu,cpuacct"]


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, ValueError):
        return None
