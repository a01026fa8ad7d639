"""Where benchmarks keep what they create (peer servers' virtual environments, downloads, profiles).

Never inside the source tree: ``$KSERVE_V2_CACHE`` when set, else ``$XDG_CACHE_HOME/kserve_v2``,
else ``~/.cache/kserve_v2`` (the XDG Base Directory specification's default). Created on demand.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """The folder ``<cache>/<parts...>``, created if missing.

    Raises:
        OSError: the folder cannot be created (read-only home, say); set ``KSERVE_V2_CACHE``.
    """
    base = os.environ.get("KSERVE_V2_CACHE")
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        base = str(Path(xdg) / "kserve_v2")
    folder = Path(base).expanduser().joinpath(*parts)
    folder.mkdir(parents=True, exist_ok=True)
    return folder
