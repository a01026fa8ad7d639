"""Triton's redis response cache (--cache-config redis,host=...,port=..., response_cache { enable: true })
against a real Redis server started here: two servers share one cache (a response the first stored
answers the second without its model), BYTES outputs come back, the server does not start without
Redis (Triton's text), and a Redis lost while serving turns lookups into misses the model answers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from helpers import EXAMPLES, ROOT, Server, free_port, start_server, wait_until

REDIS_SERVER = shutil.which("redis-server")
if REDIS_SERVER is None:
    if os.environ.get("CI"):  # make test installs it (Debian's redis-server): CI must run these tests
        raise RuntimeError("redis-server is not installed: `make test` installs it")
    pytest.skip("redis-server is not installed (`make test` installs Debian's)", allow_module_level=True)


class Redis:
    """A Redis server of this test's own, on a free loopback port, persisting nothing."""

    def __init__(self, folder: Path) -> None:
        self.port = free_port()
        self._folder = folder
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self._folder.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen([str(REDIS_SERVER), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", str(self._folder)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: self.command("PING") == "PONG", "redis-server to answer", timeout=30)

    def command(self, *words: str) -> str:
        """One redis-cli command's output ('' when Redis does not answer)."""
        done = subprocess.run([str(Path(str(REDIS_SERVER)).with_name("redis-cli")), "-p", str(self.port), *words],
                              capture_output=True, text=True, timeout=30)
        return done.stdout.strip() if done.returncode == 0 else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


def _repository(root: Path) -> Path:
    repository = root / "repo"
    for name in ("simple", "simple_string"):
        shutil.copytree(EXAMPLES / name, repository / name)
        config = repository / name / "config.pbtxt"
        config.write_text(config.read_text() + "\nresponse_cache { enable: true }\n")
    return repository


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Redis]:
    server = Redis(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


def _flags(redis: Redis) -> tuple[str, ...]:
    return ("--cache-config", "redis,host=127.0.0.1", "--cache-config", f"redis,port={redis.port}")


def _counts(stats: dict) -> tuple[int, int, int]:
    """(cache hits, cache misses, executions) of a model's statistics (JSON leaves zeros out)."""
    inference = stats.get("inference_stats", {})
    return (int(inference.get("cache_hit", {}).get("count", 0)), int(inference.get("cache_miss", {}).get("count", 0)),
            int(stats.get("execution_count", 0)))


def _simple(url: str, first: int) -> tuple[np.ndarray, tuple[int, int, int]]:
    """``simple`` over gRPC with INPUT0 = first.., INPUT1 = 1: (OUTPUT0, ``_counts`` of its statistics)."""
    x = np.arange(first, first + 16, dtype=np.int32).reshape(1, 16)
    with grpcclient.InferenceServerClient(url) as client:
        inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_data_from_numpy(x)
        inputs[1].set_data_from_numpy(np.ones_like(x))
        out = client.infer("simple", inputs).as_numpy("OUTPUT0")
        stats = client.get_inference_statistics("simple", as_json=True)["model_stats"][0]
    assert np.array_equal(out, x + 1)
    return out, _counts(stats)


def test_two_servers_share_one_cache(tmp_path: Path, redis: Redis) -> None:
    repository = _repository(tmp_path)
    first = start_server(repository, tmp_path / "a", *_flags(redis))
    second = start_server(repository, tmp_path / "b", *_flags(redis))
    try:
        assert "Response Cache is Redis at 127.0.0.1" in first.log()
        assert _simple(first.url, 100)[1] == (0, 1, 1)
        assert redis.command("DBSIZE") == "1"
        assert _simple(second.url, 100)[1] == (1, 0, 0)  # stored by the first server
        assert _simple(second.url, 200)[1] == (1, 1, 1)  # another input: a miss the model answers
        assert redis.command("DBSIZE") == "2"
        # BYTES outputs over REST, stored by one server and read back by the other
        texts = np.array([[str(i).encode() for i in range(16)]], dtype=object)
        answers = []
        for server in (first, second):
            with httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}") as client:
                inputs = [httpclient.InferInput("INPUT0", [1, 16], "BYTES"), httpclient.InferInput("INPUT1", [1, 16], "BYTES")]
                for tensor in inputs:
                    tensor.set_data_from_numpy(texts)
                answers.append(client.infer("simple_string", inputs).as_numpy("OUTPUT0"))
                counts = _counts(client.get_inference_statistics("simple_string")["model_stats"][0])
        assert answers[0].tolist() == answers[1].tolist() == [[str(2 * i).encode() for i in range(16)]]
        assert counts == (1, 0, 0)
    finally:
        first.stop()
        second.stop()


def test_the_server_does_not_start_without_redis(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "kserve_v2", "serve", "--model-repository", str(_repository(tmp_path)),
                           "--grpc-port", "0", "--http-port", "0", "--metrics-port", "0", "--cache-config",
                           "redis,host=127.0.0.1", "--cache-config", f"redis,port={free_port()}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "cannot start: Failed to initialize RedisCache: Error 111 connecting to 127.0.0.1" in done.stderr + done.stdout


def test_redis_lost_while_serving_means_misses_the_model_answers(tmp_path: Path) -> None:
    redis = Redis(tmp_path / "lost")
    redis.start()
    server: Server | None = None
    try:
        server = start_server(_repository(tmp_path), tmp_path / "logs", *_flags(redis),
                              "--cache-config", "redis,socket_timeout=2000", "--cache-config", "redis,connect_timeout=2000")
        _simple(server.url, 1)
        redis.stop()
        started = time.monotonic()
        assert _simple(server.url, 1)[1] == (0, 2, 2)  # its entry is gone with Redis: the model answers it
        assert time.monotonic() - started < 10
        assert "Failed to retrieve key: kserve_v2:response:" in server.log()
    finally:
        redis.stop()
        if server is not None:
            server.stop()
