"""Triton's model repository layout, read without loading anything.

``<repo>/<model>/[config.pbtxt] <version>/<model file>`` (Triton ``model_repository.md``):
version folders are positive integers without leading zeros; anything else is ignored.
Model names are checked here before they touch the file system.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.protocol.errors import InvalidInput
from kserve_v2.repository import remote

MAX_NAME_BYTES = 255


def validate_model_name(name: str) -> str:
    """Return ``name`` if it is a single, safe path component.

    Rejects what Triton's ``L0_input_validation`` rejects: empty or blank names, ``.``/``..``
    (also with surrounding blanks), path separators, absolute paths and NUL; plus names longer
    than 255 bytes. Names such as ``...`` or ``model..1`` are allowed.

    Raises:
        InvalidInput: the name is unsafe -> INVALID_ARGUMENT.
    """
    if not name.strip():
        raise InvalidInput("Model name cannot be empty")
    if name.strip() in {".", ".."} or any(c in name for c in "/\\\0"):
        raise InvalidInput(f"Model name '{name}' is not a valid directory name: no path separators or '..'")
    if len(name.encode("utf-8")) > MAX_NAME_BYTES:
        raise InvalidInput(f"Model name is longer than {MAX_NAME_BYTES} bytes")
    return name


def unreadable(repositories: Iterable[Path]) -> str:
    """Why the first repository that cannot be listed cannot be (a missing folder, a file, no
    permission; for a remote repository's mirror, why its store cannot be listed), or "" when every one can."""
    for repo in repositories:
        store = remote.mirrored(repo)
        if store is not None:
            reason = store.check()
            if reason:
                return reason
            continue
        if not repo.is_dir():
            return f"model repository '{repo}' is not a directory"
        try:
            next(repo.iterdir(), None)
        except OSError as err:
            return f"model repository '{repo}' cannot be read: {err.strerror}"
    return ""


def model_dirs(repositories: Iterable[Path]) -> dict[str, list[Path]]:
    """Every subdirectory of every repository, by name (a name in two repositories is ambiguous); for a
    remote repository's mirror, every model folder of the store's listing (downloaded or not: ``remote``)."""
    found: dict[str, list[Path]] = {}
    for repo in repositories:
        store = remote.mirrored(repo)
        if store is not None:
            for name in sorted(store.listing()):
                found.setdefault(name, []).append(repo / name)
            continue
        for child in sorted(repo.iterdir()):
            if child.is_dir() and not child.name.startswith("."):
                found.setdefault(child.name, []).append(child)
    return found


def version_dirs(model_dir: Path) -> list[int]:
    """Numeric version folders of a model, ascending."""
    versions = []
    for child in model_dir.iterdir():
        name = child.name
        if child.is_dir() and name.isdigit() and not name.startswith("0"):
            versions.append(int(name))
    return sorted(versions)


def select_versions(available: list[int], policy: mc.ModelVersionPolicy) -> list[int]:
    """Apply a version policy: latest N (default 1), all, or a specific list (ascending)."""
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        return list(available)
    if choice == "specific":
        wanted = set(policy.specific.versions)
        return [v for v in available if v in wanted]
    count = policy.latest.num_versions if choice == "latest" else 1
    return available[-max(count, 1) :] if available else []


def modified_ns(model_dir: Path) -> int:
    """When anything in a model folder last changed (ns): the newest modification time of the folder and,
    recursively, of everything in it, symlinks followed (Triton's ``ModelTimestamp``; what cannot be read
    counts as 0, a folder reached twice once)."""
    newest = 0
    seen: set[tuple[int, int]] = set()
    pending = [model_dir]
    while pending:
        path = pending.pop()
        try:
            stat = path.stat()
            newest = max(newest, stat.st_mtime_ns)
            if path.is_dir() and (stat.st_dev, stat.st_ino) not in seen:
                seen.add((stat.st_dev, stat.st_ino))
                pending.extend(path.iterdir())
        except OSError:
            continue
    return newest
