"""Control mode ``poll``: rescan the repositories and follow what changed on disk.

Every ``--repository-poll-secs`` a model folder that appeared is loaded, one whose files changed
(name, size or mtime of any file under it, config.pbtxt and version folders included) is
reloaded, and one that disappeared is unloaded (Triton ``model_management.md``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path

from kserve_v2.protocol.errors import ServerError
from kserve_v2.repository import layout, remote
from kserve_v2.repository.manager import ModelManager

log = logging.getLogger(__name__)

Snapshot = dict[str, frozenset[tuple[str, int, int]]]
MAX_FILES_PER_MODEL = 10_000


def snapshot(repositories: list[Path]) -> Snapshot:
    """Fingerprint of every model folder: (relative path, size, mtime ns) of each file (blocking)."""
    return {name: frozenset(itertools.islice(_files(dirs), MAX_FILES_PER_MODEL))
            for name, dirs in layout.model_dirs(repositories).items()}


def _files(dirs: list[Path]) -> Iterator[tuple[str, int, int]]:
    for folder in dirs:
        store = remote.mirrored(folder.parent)
        if store is not None:  # a remote repository: the store's listing (ETags for mtimes), nothing downloaded
            yield from store.fingerprints(folder.name)
            continue
        for root, _, names in os.walk(folder):
            for file in names:
                path = Path(root, file)
                try:
                    stat = path.stat()
                except OSError:
                    continue  # removed while walking
                yield str(path.relative_to(folder)), stat.st_size, stat.st_mtime_ns


async def follow(manager: ModelManager, name: str, present: bool) -> None:
    """Apply one change found on disk: load (or reload) a model folder that appeared or changed,
    unload and forget one that disappeared. A failed load is logged and leaves its reason in the
    versions' states."""
    if present:
        try:
            await manager.load(name)
        except ServerError:
            pass  # logged by load; the versions carry the reason
        return
    await manager.unload(name)
    manager.forget(name)


# applies one change: (model name, whether its folder is there) - ``follow`` on one manager, or on every replica
Apply = Callable[[str, bool], Awaitable[None]]


async def poll(apply: Apply, repositories: list[Path], interval_secs: float, previous: Snapshot,
               at_once: int = 1) -> None:
    """Run forever (until cancelled), applying each change found on disk with ``apply``, up to
    ``at_once`` of a scan's changes at a time (Triton's ``--model-load-thread-count``)."""
    while True:
        await asyncio.sleep(interval_secs)
        current = await asyncio.to_thread(snapshot, repositories)
        changes = []
        for name in sorted(current):
            if current[name] != previous.get(name):
                log.info("poll: model folder '%s' %s", name, "changed" if name in previous else "appeared")
                changes.append((name, True))
        for name in sorted(set(previous) - set(current)):
            log.info("poll: model folder '%s' disappeared", name)
            changes.append((name, False))
        await at_most(at_once, [apply(name, present) for name, present in changes])
        previous = current


async def at_most(count: int, calls: Sequence[Awaitable[None]]) -> None:
    """Await ``calls``, at most ``count`` of them at a time, in order."""
    slots = asyncio.Semaphore(count)

    async def one(call: Awaitable[None]) -> None:
        async with slots:
            await call

    await asyncio.gather(*(one(call) for call in calls))
