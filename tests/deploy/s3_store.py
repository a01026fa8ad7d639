"""An S3 endpoint on this host for `make image-check`: moto's standalone S3 server (the S3 REST API, as MinIO serves
it) in a subprocess on a free loopback port, as tests/server/test_object_storage.py starts it, with a bucket to
upload a model repository to. A container on the host's network reads it at ``s3://127.0.0.1:<port>/<bucket>/...``
(Triton's form of a URL with an S3-compatible endpoint) with the credentials in ``credentials()``.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import TracebackType

import boto3

KEY_ID = "AKIAKSERVEV2IMAGE001"
SECRET = "kserve-v2-image-check-secret-0123456789"
REGION = "us-east-1"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def answers(endpoint: str) -> bool:
    """Whether moto's server at ``endpoint`` (``http://host:port``) answers its API yet."""
    try:
        urllib.request.urlopen(endpoint + "/moto-api/", timeout=1).close()
        return True
    except OSError:
        return False


class MotoS3:
    """moto's S3 server on ``127.0.0.1:port`` until ``stop()`` (or the end of a ``with`` block); its output in ``log``."""

    def __init__(self, log: Path, timeout: float = 60) -> None:
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        self._log = open(log, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not self._up():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"moto's S3 server did not start on port {self.port} within {timeout} s "
                                   f"(exit {self.proc.returncode}):\n{log.read_text()[-3000:]}")
            time.sleep(0.1)  # polls the condition above, within the deadline
        self.s3 = boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=KEY_ID,
                               aws_secret_access_key=SECRET, region_name=REGION)

    def _up(self) -> bool:
        return answers(self.endpoint)

    def upload(self, folder: Path, bucket: str, prefix: str) -> list[str]:
        """Every file under ``folder`` as ``prefix/<its path under folder>`` in ``bucket`` (made here); the keys."""
        self.s3.create_bucket(Bucket=bucket)
        keys = []
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            key = f"{prefix}/{path.relative_to(folder).as_posix()}"
            self.s3.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
            keys.append(key)
        return keys

    def url(self, bucket: str, prefix: str) -> str:
        """The repository URL the server takes (``--model-repository``): Triton's ``s3://host:port/bucket/path``."""
        return f"s3://127.0.0.1:{self.port}/{bucket}/{prefix}"

    @staticmethod
    def credentials() -> dict[str, str]:
        """The AWS variables the server reads (botocore's chain), as a Secret's env would give them to a pod."""
        return {"AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": REGION}

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 30 s) and close its log."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self._log.close()

    def __enter__(self) -> MotoS3:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()
