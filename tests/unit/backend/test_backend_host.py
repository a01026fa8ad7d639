"""The backend host (kserve_v2.backend.host): openers of both shapes, and two servers' hosts in one process
kept apart (custom metrics, model code's calls, rate limiter), with model code finding its own host."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from google.protobuf import text_format

from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend import PYTHON, Backend, BackendHost, RequestContext, find
from kserve_v2.backend.local_calls import LocalCalls
from kserve_v2.repository.manager import ModelManager
from kserve_v2.scheduling.rate_limiter import RateLimiter, from_settings

CONFIG = ('name: "metered" backend: "python"\n'
          'instance_group [{ name: "metered_0" count: 1 kind: KIND_CPU '
          'rate_limiter { resources [{ name: "R" count: 2 }] } }]\n')
# creates a family in initialize (labelled by whether the server's readiness call says "probe" is ready), and one
# from a thread it starts in execute, which runs as that execute (pb_utils' last execute); a family lives as long as
# the model holds it
MODEL = '''
import threading
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.family = pb_utils.MetricFamily(name="loads", description="", kind=pb_utils.MetricFamily.COUNTER)
        self.loads = self.family.Metric(labels={"probe_ready": str(pb_utils.is_model_ready("probe"))})
        self.loads.increment(1)

    def execute(self, requests):
        thread = threading.Thread(target=self._count)
        thread.start()
        thread.join()
        return [pb_utils.InferenceResponse(output_tensors=[]) for _ in requests]

    def _count(self):
        self.threaded = pb_utils.MetricFamily(name="from_thread", description="", kind=pb_utils.MetricFamily.GAUGE)
        self.threaded.Metric().set(1)
'''


def repository(tmp_path: Path) -> Path:
    folder = tmp_path / "repository" / "metered"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(CONFIG)
    (folder / "1" / "model.py").write_text(MODEL)
    return folder.parent


def samples(host: BackendHost) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in host.custom_metrics.collect() for sample in family.samples}


def calls(ready: bool) -> LocalCalls:
    async def refused(request: Any) -> Any:
        raise AssertionError("no inference in this test")

    made = LocalCalls(refused, refused, ready=lambda request: pb.ModelReadyResponse(ready=ready))
    made.loop = asyncio.get_running_loop()
    return made


def test_an_opener_gets_the_host_when_it_takes_four_arguments() -> None:
    seen: list[tuple[Any, ...]] = []
    host, folder, config = BackendHost(), Path("/models/m"), mc.ModelConfig(name="m")

    def earlier(model_dir: Path, version: int, config: mc.ModelConfig) -> Any:
        seen.append((model_dir, version, config))
        return "earlier"

    def hosted(model_dir: Path, version: int, config: mc.ModelConfig, host: BackendHost) -> Any:
        seen.append((model_dir, version, config, host))
        return "hosted"

    class Adapter:  # a class as the opener, as the text adapters' backends are
        def __init__(self, model_dir: Path, version: int, config: mc.ModelConfig) -> None:
            seen.append((model_dir, version, config))

    assert Backend(earlier).open_model(folder, 3, config, host) == "earlier"
    assert Backend(hosted).open_model(folder, 3, config, host) == "hosted"
    assert isinstance(Backend(Adapter).open_model(folder, 3, config, host), Adapter)
    assert seen == [(folder, 3, config), (folder, 3, config, host), (folder, 3, config)]


def test_two_servers_in_one_process_keep_their_hosts_apart(tmp_path: Path) -> None:
    root = repository(tmp_path)

    async def main() -> None:
        limiters = [RateLimiter(), RateLimiter()]
        hosts = [BackendHost(calls=calls(ready), rate_limiter=limiter)
                 for ready, limiter in zip((True, False), limiters, strict=True)]
        managers = [ModelManager([root], 0, lambda: None) for _ in hosts]
        for manager, host in zip(managers, hosts, strict=True):
            manager.host = host
            await manager.load("metered")
            assert manager.is_ready("metered", "")
        # each server's store has its own model's family, counted once, with its own server's answer
        assert samples(hosts[0]) == {("loads", (("probe_ready", "True"),)): 1.0}
        assert samples(hosts[1]) == {("loads", (("probe_ready", "False"),)): 1.0}
        assert [limiter.limits() for limiter in limiters] == [{(0, "R"): 2}] * 2
        await managers[0].unload("metered")  # the families and resources of the first server's version go
        assert samples(hosts[0]) == {} and limiters[0].limits() == {}
        assert samples(hosts[1]) == {("loads", (("probe_ready", "False"),)): 1.0}
        assert limiters[1].limits() == {(0, "R"): 2}
        await managers[1].close()

    asyncio.run(main())


def test_a_thread_the_model_starts_finds_the_host_of_its_model(tmp_path: Path) -> None:
    folder = repository(tmp_path) / "metered"
    backend = find(PYTHON)
    assert backend is not None

    async def main() -> None:
        hosts = [BackendHost(calls=calls(True)), BackendHost(calls=calls(True))]
        models = [await asyncio.to_thread(backend.open_model, folder, 1, text_format.Parse(CONFIG, mc.ModelConfig()), host)
                  for host in hosts]
        await asyncio.to_thread(models[1].execute, {}, [], {}, RequestContext(calls=hosts[1].calls))
        assert ("from_thread", ()) in samples(hosts[1]) and ("from_thread", ()) not in samples(hosts[0])
        for model in models:
            model.close()

    asyncio.run(main())


def test_rate_limiting_is_on_only_with_execution_count() -> None:
    assert from_settings("off") is None
    assert isinstance(from_settings("execution_count"), RateLimiter)
