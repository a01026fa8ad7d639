"""Triton's response cache (--cache-config local,size=<bytes>, response_cache { enable: true }): a repeated
request is answered without its model, over gRPC and REST alike, and counted in ModelStatistics and
/metrics as Triton counts it; a different input misses; the least recently used entry is evicted;
sequence and decoupled models are refused; malformed flags are usage errors."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from helpers import ROOT, Server, add_python_model, metric, scrape, start_server

# Counts its executions in a file named by the COUNT parameter; Y = X * 2.
COUNTING = '''
    import json

    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.count = json.loads(args["model_config"])["parameters"]["COUNT"]["string_value"]

        def execute(self, requests):
            responses = []
            for request in requests:
                with open(self.count, "a") as log:
                    log.write("x\\n")
                x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 2)]))
            return responses
'''
_TENSORS = ('input [{ name: "X" data_type: TYPE_FP32 dims: [ -1 ] }]\n'
            'output [{ name: "Y" data_type: TYPE_FP32 dims: [ -1 ] }]\n')


def _counting(repository: Path, name: str, count: Path, extra: str = "response_cache { enable: true }") -> None:
    add_python_model(repository, name, _TENSORS + f'parameters {{ key: "COUNT" value: {{ string_value: "{count}" }} }}\n'
                     + extra, COUNTING)


def _calls(count: Path) -> int:
    return len(count.read_text().splitlines()) if count.exists() else 0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    root = tmp_path_factory.mktemp("cache")
    repository = root / "repo"
    _counting(repository, "cached", root / "cached.count")
    _counting(repository, "uncached", root / "uncached.count", "")
    # 40 FP32 elements take 160 bytes of data, ~200 bytes with their name, datatype and shape: 3 fit in 700
    _counting(repository, "small", root / "small.count")
    _counting(repository, "step", root / "step.count", "")
    (repository / "ensemble" / "1").mkdir(parents=True)  # a cached ensemble over an uncached step
    (repository / "ensemble" / "config.pbtxt").write_text(
        'platform: "ensemble"\n' + _TENSORS + 'response_cache { enable: true }\n'
        'ensemble_scheduling { step [{ model_name: "step" model_version: -1 input_map { key: "X" value: "X" } '
        'output_map { key: "Y" value: "Y" } }] }\n')
    srv = start_server(repository, root / "logs", "--cache-config", "local,size=700")
    yield srv, root
    srv.stop()


def _grpc(url: str, model: str, x: np.ndarray) -> np.ndarray:
    with grpcclient.InferenceServerClient(url) as client:
        tensor = grpcclient.InferInput("X", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        out = client.infer(model, [tensor]).as_numpy("Y")
        assert out is not None
        return out


def _rest(url: str, model: str, x: np.ndarray, binary: bool) -> np.ndarray:
    with httpclient.InferenceServerClient(url) as client:
        tensor = httpclient.InferInput("X", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=binary)
        out = client.infer(model, [tensor], outputs=[httpclient.InferRequestedOutput("Y", binary_data=binary)])
        result = out.as_numpy("Y")
        assert result is not None
        return result


def _stats(url: str, model: str) -> dict[str, dict[str, int]]:
    with grpcclient.InferenceServerClient(url) as client:
        stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    return {key: {k: int(v) for k, v in value.items()} for key, value in stats["inference_stats"].items()}


def test_repeated_request_is_a_hit_on_every_transport(server: tuple[Server, Path]) -> None:
    srv, root = server
    count = root / "cached.count"
    x = np.arange(4, dtype=np.float32)
    assert _grpc(srv.url, "cached", x).tolist() == [0, 2, 4, 6]  # a miss: the model runs
    assert _calls(count) == 1
    assert _grpc(srv.url, "cached", x).tolist() == [0, 2, 4, 6]  # hits, through each transport
    assert _rest(srv.http_url, "cached", x, binary=True).tolist() == [0, 2, 4, 6]
    assert _rest(srv.http_url, "cached", x, binary=False).tolist() == [0, 2, 4, 6]
    assert _calls(count) == 1
    stats = _stats(srv.url, "cached")
    assert stats["cache_hit"]["count"] == 3 and stats["cache_hit"]["ns"] > 0
    assert stats["cache_miss"]["count"] == 1 and stats["cache_miss"]["ns"] > 0
    assert stats["success"]["count"] == 4 and stats["queue"]["count"] == 4
    assert stats["compute_infer"]["count"] == 1  # Triton's: successes less hits
    with grpcclient.InferenceServerClient(srv.url) as client:
        row = client.get_inference_statistics("cached", as_json=True)["model_stats"][0]
    assert int(row["inference_count"]) == 1 and int(row["execution_count"]) == 1
    samples = scrape(srv.metrics_port)
    assert metric(samples, "nv_cache_num_hits_per_model", model="cached", version="1") == 3
    assert metric(samples, "nv_cache_num_misses_per_model", model="cached", version="1") == 1
    assert metric(samples, "nv_cache_hit_duration_per_model", model="cached", version="1") >= 0
    assert metric(samples, "nv_cache_miss_duration_per_model", model="cached", version="1") >= 0
    assert metric(samples, "nv_inference_request_success", model="cached", version="1") == 4
    assert metric(samples, "nv_inference_count", model="cached", version="1") == 1  # hits are no inferences
    assert metric(samples, "nv_cache_num_hits") >= 3
    assert metric(samples, "nv_cache_num_entries") >= 1
    assert 0 < metric(samples, "nv_cache_util") <= 1


def test_different_input_or_shape_is_a_miss(server: tuple[Server, Path]) -> None:
    srv, root = server
    count = root / "cached.count"
    x = np.full(6, 3, dtype=np.float32)
    _grpc(srv.url, "cached", x)
    before = _calls(count)
    changed = x.copy()
    changed.view(np.uint8)[0] ^= 1  # one input byte differs
    assert _grpc(srv.url, "cached", changed).tolist() == (changed * 2).tolist()
    assert _calls(count) == before + 1
    assert _grpc(srv.url, "cached", x[:3]).tolist() == [6, 6, 6]  # a prefix of the same bytes: another shape
    assert _calls(count) == before + 2
    _grpc(srv.url, "cached", changed)
    assert _calls(count) == before + 2  # and each is then a hit
    with grpcclient.InferenceServerClient(srv.url) as client:
        tensor = grpcclient.InferInput("X", [6], "FP32")
        tensor.set_data_from_numpy(x)
        client.infer("cached", [tensor], parameters={"mode": "other"})  # a parameter the model sees: a miss
        assert _calls(count) == before + 3
        client.infer("cached", [tensor], priority=1)  # a scheduling field: the same entry
        assert _calls(count) == before + 3


def test_model_without_response_cache_is_not_cached(server: tuple[Server, Path]) -> None:
    srv, root = server
    x = np.ones(2, dtype=np.float32)
    _grpc(srv.url, "uncached", x)
    _grpc(srv.url, "uncached", x)
    assert _calls(root / "uncached.count") == 2
    stats = _stats(srv.url, "uncached")
    assert stats["cache_hit"].get("count", 0) == 0 and stats["cache_miss"].get("count", 0) == 0


def test_ensemble_hit_skips_its_steps(server: tuple[Server, Path]) -> None:
    srv, root = server
    x = np.full(3, 5, dtype=np.float32)
    assert _grpc(srv.url, "ensemble", x).tolist() == [10, 10, 10]
    assert _rest(srv.http_url, "ensemble", x, binary=False).tolist() == [10, 10, 10]
    assert _calls(root / "step.count") == 1  # Triton's top-level ensemble caching: the steps did not run again
    assert _stats(srv.url, "ensemble")["cache_hit"]["count"] == 1


def test_least_recently_used_entry_is_evicted(server: tuple[Server, Path]) -> None:
    srv, root = server
    count = root / "small.count"
    # 700 bytes hold three 40-element responses, but the cache is shared with the other tests' entries:
    # fill it with four distinct requests, then the first must have been evicted
    inputs = [np.full(40, i, dtype=np.float32) for i in range(4)]
    for x in inputs:
        _grpc(srv.url, "small", x)
    assert _calls(count) == 4
    _grpc(srv.url, "small", inputs[3])  # the newest is still there
    assert _calls(count) == 4
    _grpc(srv.url, "small", inputs[0])  # the oldest was evicted
    assert _calls(count) == 5
    assert metric(scrape(srv.metrics_port), "nv_cache_num_evictions") >= 1
    big = np.zeros(1000, dtype=np.float32)  # 4000 bytes: larger than the whole cache, never stored
    _grpc(srv.url, "small", big)
    _grpc(srv.url, "small", big)
    assert _calls(count) == 7
    assert "is greater than total cache size: 700" in srv.log()


REFUSED = {"refused_sequence": "sequence_batching { }", "refused_decoupled": "model_transaction_policy { decoupled: true }"}


@pytest.fixture(scope="module")
def refusing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server with a cache that loads the models of ``REFUSED`` at start: each has response_cache on
    and a scheduler or policy the cache does not support."""
    root = tmp_path_factory.mktemp("refused")
    for name, extra in REFUSED.items():
        _counting(root / "repo", name, root / f"{name}.count", "response_cache { enable: true }\n" + extra)
    loads = [arg for name in REFUSED for arg in ("--load-model", name)]
    srv = start_server(root / "repo", root / "logs", "--cache-config=local,size=1048576",  # Triton's '=' form
                       "--model-control-mode", "explicit", *loads, "--exit-on-error", "false")
    yield srv
    srv.stop()


@pytest.mark.parametrize(("name", "text"), [
    ("refused_sequence", "with sequence batching scheduler. Please disable the response cache."),
    ("refused_decoupled", "with 'decoupled' transaction policy. Please disable the response cache."),
])
def test_sequence_and_decoupled_models_are_refused(refusing: Server, name: str, text: str) -> None:
    with grpcclient.InferenceServerClient(refusing.url) as client:
        index = {m["name"]: m for m in client.get_model_repository_index(as_json=True)["models"]}
    assert index[name]["state"] == "UNAVAILABLE"
    assert f"Response Cache does not currently support model {name} {text}" in index[name]["reason"]


def test_response_cache_without_a_server_cache_is_ignored(tmp_path: Path) -> None:
    """As in Triton, a model's response_cache needs --cache-config too: without it nothing is cached (no error)."""
    repository = tmp_path / "repo"
    _counting(repository, "cached", tmp_path / "count")
    srv = start_server(repository, tmp_path / "logs")
    try:
        x = np.ones(2, dtype=np.float32)
        _grpc(srv.url, "cached", x)
        _grpc(srv.url, "cached", x)
        assert _calls(tmp_path / "count") == 2
        assert _stats(srv.url, "cached")["cache_hit"].get("count", 0) == 0
        assert not any(name.startswith("nv_cache_") for name, _ in scrape(srv.metrics_port))
    finally:
        srv.stop()


@pytest.mark.parametrize(("args", "text"), [
    (["--cache-config", "size=10"], "No cache specified. --cache-config option format is <cache name>,<setting>=<value>. "
                                    "Got size=10"),
    (["--cache-config", "local,size"], "--cache-config option format is '<cache name>,<setting>=<value>'. Got local,size"),
    (["--cache-config=local,size="], "--cache-config option format is '<cache name>,<setting>=<value>'. Got local,size="),
    (["--cache-config", "local,other=1"], "Failed to initialize LocalCache: config didn't contain a valid 'size' field."),
    (["--cache-config", "memcached,host=localhost"], "unable to find 'libtritoncache_memcached.so' for cache. "
                                                     "Searched: /opt/tritonserver/caches"),
    (["--cache-config", "redis,host=localhost"], "Failed to initialize RedisCache, didn't specify address. Must at a "
                                                 "minimum specify 'host' and 'port' in the configuration"),
    (["--cache-config", "local,size=1", "--cache-config", "redis,host=h"],
     "found multiple cache configurations, but only a single cache is currently supported"),
    (["--cache-config", "local,size=1", "--response-cache-byte-size", "1"],
     "Error: Incompatible flags --response-cache-byte-size and --cache-config both provided."),
])
def test_malformed_cache_flags_are_usage_errors(tmp_path: Path, args: list[str], text: str) -> None:
    done = subprocess.run([sys.executable, "-m", "kserve_v2", "serve", "--model-repository", str(tmp_path), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert text in done.stderr
