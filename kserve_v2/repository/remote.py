"""Remote model repositories (``s3://``, ``gs://``, ``as://``; ``stores``) mirrored to a local folder.

A remote repository is given to the rest of the server as its mirror folder: ``TRITON_AWS_MOUNT_DIRECTORY``,
``TRITON_GCS_MOUNT_DIRECTORY`` or ``TRITON_AZURE_MOUNT_DIRECTORY`` when set (it must exist and be empty, as
Triton's ``model_repository.md`` says), else a temporary folder removed when the process exits. Listing a
mirror folder (``layout.model_dirs``, the poller's snapshots, RepositoryIndex) reads the store's listing
(names, sizes, ETags) and downloads nothing; a model folder is downloaded just before it loads
(``fetch_model``): into a staging folder next to it, renamed into place once complete, so a partial download
never loads. Files already downloaded whose ETag did not change are linked, not downloaded again, and files
stream to disk. The local loading code then reads the mirror as it reads any folder.

A listing that fails (endpoint unreachable, no bucket, credentials refused) fails the start
(``unreadable``) or the load that needs it (``fetch_model``, ``unlisted``), with a text naming the URL and no
secret; a poll whose listing fails keeps the last listing, so loaded versions keep serving, and tries again next
time. A prefix that holds no object in a bucket that exists is an empty repository, not a failure: a poll sees
no model and unloads the last one (Triton lists it so). At start, as in Triton, it is no repository (``check``).
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kserve_v2.protocol.errors import InternalError
from kserve_v2.repository import stores

log = logging.getLogger(__name__)

MOUNT_VARIABLES = {"s3": "TRITON_AWS_MOUNT_DIRECTORY", "gs": "TRITON_GCS_MOUNT_DIRECTORY",
                   "as": "TRITON_AZURE_MOUNT_DIRECTORY"}

# after a failed listing, the last good one answers for this long without trying the store again: queries on
# the event loop (RepositoryIndex, model metadata) do not each wait for an unreachable endpoint's timeouts
RETRY_AFTER_FAILURE_SECS = 5.0

# relative path -> (size in bytes, fingerprint of the ETag / modification time, path in the store)
Files = dict[str, tuple[int, int, str]]


class RemoteRepository:
    """One remote repository and its local mirror folder.

    Args:
        location: where it is (``stores.parse_location``).
        mirror: the local folder model folders are downloaded into (exists).
    """

    def __init__(self, location: stores.StoreLocation, mirror: Path) -> None:
        self.location = location
        self.mirror = mirror
        self._store: Any = None
        self._lock = threading.Lock()
        self._listing: dict[str, Files] | None = None  # model name -> its files, as last listed
        self._failed_at = -RETRY_AFTER_FAILURE_SECS  # time.monotonic() of the last failed listing
        self.failed = ""  # why the last listing failed (``reason``), or "" when it was read

    @property
    def store(self) -> Any:
        """The fsspec file system (made on first use)."""
        if self._store is None:
            self._store = stores.open_store(self.location)
        return self._store

    @property
    def url(self) -> str:
        """The repository's URL as texts show it (``stores.public_url``: no user information, no query)."""
        return stores.public_url(self.location.url)

    @staticmethod
    def reason(err: BaseException) -> str:
        """A store library's error as a short text, with no secret (``stores.redact``)."""
        return stores.redact(f"{type(err).__name__}: {err}" if str(err) else type(err).__name__)

    def failure(self, err: BaseException) -> str:
        """Why the store cannot be read, naming the URL and no secret."""
        return f"model repository '{self.url}' cannot be read: {self.reason(err)}"

    def poll_failure(self, name: str, reason: str) -> InternalError:
        """A load of model ``name`` that this repository's listing failed, logged: Triton's text ("failed to load
        '<m>', failed to poll from model repository"), then the URL and ``reason``.

        Returns:
            InternalError -> INTERNAL / 500, for the caller to raise.
        """
        text = f"failed to load '{name}', failed to poll from model repository '{self.url}': {reason}"
        log.error("%s", text)
        return InternalError(text)

    def _list(self, prefix: str) -> dict[str, Files]:
        """Every file under ``root/prefix``, by model name (blocking; raises what the store raises). Nothing under
        it is an empty listing when the bucket (Azure: the container) exists.

        Raises:
            FileNotFoundError: no such bucket; else what the store library raises (endpoint unreachable,
                credentials refused).
        """
        root = self.location.root
        base = f"{root}/{prefix}".rstrip("/")
        listed = self.store.find(base, detail=True)
        if not listed:  # an empty prefix, or a missing bucket that the library lists as empty (adlfs)
            bucket = root.split("/")[0]
            try:
                self.store.info(bucket)
            except FileNotFoundError:
                kind = "container" if self.location.scheme == "as" else "bucket"
                raise FileNotFoundError(f"no such {kind} '{bucket}'") from None
        found: dict[str, Files] = {}
        for path, info in listed.items():
            relative = path[len(root):].lstrip("/")
            name, _, rest = relative.partition("/")
            if not rest or name.startswith(".") or info.get("type", "file") != "file":
                continue  # a file at the repository's top level, or a hidden folder
            tag = str(info.get("ETag") or info.get("etag") or info.get("md5Hash") or info.get("LastModified")
                      or info.get("updated") or info.get("last_modified") or "")
            fingerprint = int.from_bytes(hashlib.blake2b(tag.encode(), digest_size=8).digest(), "big")
            found.setdefault(name, {})[rest] = (int(info.get("size") or 0), fingerprint, path)
        return found

    def listing(self) -> dict[str, Files]:
        """The repository's models and their files, listed now (blocking). A failed listing after a good one
        logs a warning and returns the last good one (poll mode retries at its next scan). On an event loop's
        thread, the last listing answers without reading the store (``refresh`` lists first where a fresh one
        matters), so a slow or unreachable store never stalls the loop; only the first listing is read there.

        Raises:
            OSError / the store library's errors: the first listing failed.
        """
        if self._listing is not None and _on_event_loop():
            return self._listing
        with self._lock:
            if self._listing is not None and time.monotonic() - self._failed_at < RETRY_AFTER_FAILURE_SECS:
                return self._listing
            try:
                self._listing, self.failed = self._list(""), ""
            except Exception as err:
                self.failed = self.reason(err)
                if self._listing is None:
                    raise
                self._failed_at = time.monotonic()
                log.warning("%s; keeping the last listing", self.failure(err))
            return self._listing

    def check(self) -> str:
        """Why the repository cannot be listed, or "" (blocking; at start). A URL whose bucket exists but whose
        path holds no object is no repository (Triton's ``IsDirectory`` is false there: "repository path is not a
        valid directory"); a URL that names a bucket alone is one, empty or not."""
        try:
            with self._lock:
                self._listing, self.failed = self._list(""), ""
        except Exception as err:
            self.failed = self.reason(err)
            return self.failure(err)
        bucket, _, path = self.location.root.partition("/")
        if path and not self._listing:
            self.failed = f"no object under '{path}/' in '{bucket}': repository path is not a valid directory"
            return f"model repository '{self.url}' cannot be read: {self.failed}"
        return ""

    def fingerprints(self, name: str) -> Iterator[tuple[str, int, int]]:
        """(relative path, size, ETag fingerprint) of each file of model ``name`` in the last listing (the
        poller's snapshot, after the ``listing`` its ``layout.model_dirs`` made)."""
        with self._lock:
            listing = self._listing if self._listing is not None else {}
        for relative, (size, fingerprint, _) in listing.get(name, {}).items():
            yield relative, size, fingerprint

    def fetch(self, name: str) -> Path:
        """Bring the mirror folder of model ``name`` up to date with the store; returns it (blocking).

        Changed and new files are downloaded (streamed to disk) into a staging folder, unchanged ones
        linked from the current copy; the staging folder then replaces the model folder.

        Raises:
            InternalError: the store cannot be read ("failed to load '<m>', failed to poll from model repository
                '<url>': <reason>", logged), or has no such model (Triton's text alone) -> INTERNAL / 500.
        """
        target = self.mirror / name
        try:
            files = self._list(name + "/").get(name, {})
        except Exception as err:
            raise self.poll_failure(name, self.reason(err)) from None
        if not files:
            raise InternalError(f"failed to load '{name}', failed to poll from model repository")
        manifest = self.mirror / ".manifests" / f"{name}.json"  # what the folder holds, for every replica
        wanted = {relative: [size, fingerprint] for relative, (size, fingerprint, _) in files.items()}
        with _FolderLock(self.mirror):
            try:
                held: dict[str, list[int]] = json.loads(manifest.read_text()) if target.is_dir() else {}
            except (OSError, ValueError):
                held = {}
            if target.is_dir() and held == wanted:
                return target
            staging = Path(tempfile.mkdtemp(prefix=f".staging-{name}-", dir=self.mirror))
            try:
                for relative, (_, _, path) in sorted(files.items()):
                    destination = staging / relative
                    destination.parent.mkdir(parents=True, exist_ok=True)
                    current = target / relative
                    if held.get(relative) == wanted[relative] and current.is_file():
                        os.link(current, destination)
                    else:
                        self.store.get_file(path, str(destination), **stores.DOWNLOAD_OPTIONS.get(self.location.scheme, {}))
                if target.exists():
                    retired = Path(tempfile.mkdtemp(prefix=f".retired-{name}-", dir=self.mirror))
                    target.rename(retired / name)
                    staging.rename(target)
                    shutil.rmtree(retired, ignore_errors=True)
                else:
                    staging.rename(target)
            except Exception as err:
                shutil.rmtree(staging, ignore_errors=True)
                raise self.poll_failure(name, self.reason(err)) from None
            manifest.parent.mkdir(exist_ok=True)
            manifest.write_text(json.dumps(wanted))
            log.info("model '%s': %d files from %s in %s", name, len(files), self.url, target)
        return target


class _FolderLock:
    """An exclusive lock on a mirror folder, across threads and processes (``--workers N``)."""

    def __init__(self, folder: Path) -> None:
        self._path = folder / ".lock"
        self._fd = -1

    def __enter__(self) -> None:
        self._fd = os.open(self._path, os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *_: object) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)


_MIRRORS: dict[Path, RemoteRepository] = {}  # mirror folder -> its remote repository
_CLAIMED: set[Path] = set()  # mount folders this process has checked and uses


def mirrored(folder: Path) -> RemoteRepository | None:
    """The remote repository whose mirror is ``folder``, or None (a local repository)."""
    return _MIRRORS.get(folder) if _MIRRORS else None


def _on_event_loop() -> bool:
    """Whether this thread is running an event loop (the caller is a coroutine's synchronous code)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def refresh(folders: list[Path]) -> None:
    """List the remote repositories among ``folders`` again, on a worker thread (nothing for local folders), so
    that what the event loop reads next (``listing``) is the store's current content. A failed listing keeps the
    last one (``RemoteRepository.listing``)."""
    remotes = [repository for repository in map(mirrored, folders) if repository is not None]
    if remotes:
        await asyncio.to_thread(_list_all, remotes)


def _list_all(remotes: list[RemoteRepository]) -> None:
    for repository in remotes:
        try:
            repository.listing()
        except Exception:  # noqa: BLE001 - the first listing failed: the caller's own listing reports it
            pass


def fetch_model(folder: Path) -> None:
    """Before loading the model folder ``folder``: when it is in a mirror, download it (blocking); else nothing.

    Raises:
        InternalError: as ``RemoteRepository.fetch``.
    """
    repository = mirrored(folder.parent)
    if repository is not None:
        repository.fetch(folder.name)


def unlisted(name: str) -> InternalError:
    """Triton's answer to a load of model ``name`` that no repository lists: "failed to load '<m>', failed to poll
    from model repository"; when the last listing of a remote repository failed (the model may be in it), its
    URL and why follow (``RemoteRepository.poll_failure``, logged). Every remote repository of this process
    counts, those of a start that failed (``--exit-on-error=false``) too.

    Returns:
        InternalError -> INTERNAL / 500, for the caller to raise.
    """
    for repository in _MIRRORS.values():
        if repository.failed:
            return repository.poll_failure(name, repository.failed)
    return InternalError(f"failed to load '{name}', failed to poll from model repository")


def register(url: str) -> Path:
    """Make the mirror folder of repository ``url`` and return it (no network access).

    Raises:
        stores.StoreError: an unknown URL form, or the store's library is missing (naming the extra).
        ValueError: the mount folder variable names a folder that does not exist or is not empty.
    """
    location = stores.parse_location(url)
    stores.check_installed(location.scheme)
    for mirror, repository in _MIRRORS.items():
        if repository.location == location:
            return mirror
    variable = MOUNT_VARIABLES[location.scheme]
    label = hashlib.blake2b(url.encode(), digest_size=6).hexdigest()
    mount = os.environ.get(variable)
    if mount:
        base = Path(mount)
        if base not in _CLAIMED:
            if not base.is_dir():
                raise ValueError(f"{variable} '{mount}' must name an existing folder")
            # empty folders are allowed: the mirrors this command made before it started itself again (cli's
            # huge-page restart keeps the process id and parses the command line again)
            if any(not entry.is_dir() or any(entry.iterdir()) for entry in base.iterdir()):
                raise ValueError(f"{variable} '{mount}' must name an empty folder")
            _CLAIMED.add(base)
        mirror = base / f"{location.root.split('/')[0]}-{label}"
        mirror.mkdir(exist_ok=True)
    else:  # named after this process: the same folder again after a restart of the command with execve
        mirror = Path(tempfile.gettempdir(), f"kserve_v2-{os.getpid()}-{location.scheme}-{label}")
        shutil.rmtree(mirror, ignore_errors=True)  # a folder of an earlier process that had this id
        mirror.mkdir(mode=0o700)
        atexit.register(_remove, mirror, os.getpid())
    mirror = mirror.resolve()
    _MIRRORS[mirror] = RemoteRepository(location, mirror)
    return mirror


def _remove(folder: Path, owner: int) -> None:
    if os.getpid() == owner:  # not in a forked replica: the process that made it removes it
        shutil.rmtree(folder, ignore_errors=True)


def repository_argument(text: str) -> Path:
    """``--model-repository``'s type: a local folder as given, or a URL's mirror folder (``register``).

    Raises:
        argparse.ArgumentTypeError: what ``register`` refuses (a usage error).
    """
    if not stores.is_url(text):
        return Path(text)
    try:
        return register(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
