"""CPU time of one request through our own code, in-process: no network, no load generator.

Four measurements, each the process CPU time of many calls divided by their number:
- grpc: what the gRPC server runs of ours per request: ModelInfer's handler as it is registered
  (its deserializer when it has one, the servicer, its serializer when it has one) on the bytes
  perf_analyzer sends;
- rest: the REST ASGI application (``transcoding.app.build_app``, metrics on) answering
  ``POST /v2/models/simple/infer`` with a JSON body, without uvicorn;
- bare: the do-nothing ASGI app of ``ceiling_rest.py`` (reads the body, ``json.loads`` it, sends a
  prepared answer) with the same request, the floor of any REST app in this harness;
- identity: the gRPC handler on a 16 MiB FP32 request to an identity model (ms of CPU a request,
  every thread: large requests are decoded and encoded on the decode thread pool; the example
  repository's ``identity_fp32``).
Each call yields to the event loop once, as a server would between requests. These figures are
the steadiest on a shared machine; in the running server the same code costs about 1.5-2 times as
much (caches and branch predictors shared with grpc, uvicorn and the kernel).

``--source DIR`` measures another checkout as well (``git worktree add /tmp/before main``), each in
its own process, rounds alternating, to compare before and after in one sitting.

Usage: python benchmarks/in_process.py [--requests 20000] [--rounds 3] [--source DIR] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BODY = json.dumps({"inputs": [
    {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
    {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16}]}).encode()
WARM_UP = 2000
IDENTITY_ELEMENTS = 4 << 20  # 16 MiB of FP32


async def _measure(source: Path, requests: int) -> dict[str, float]:
    """µs of CPU per call of each path, with the code of ``source`` (already first on sys.path)."""
    from ceiling_rest import application, prepared
    from prometheus_client import CollectorRegistry

    from kserve_v2._proto import grpc_service_pb2 as pb
    from kserve_v2._proto import grpc_service_pb2_grpc as pb_grpc
    from kserve_v2.grpc import servicer as servicer_module
    from kserve_v2.repository.manager import ModelManager

    # each name where this checkout has it, else where an older one (--source) had it: before the
    # subpackages by concern, and before the HTTP application left transcoding.rest
    InferenceMetrics = _first("kserve_v2.observability.metrics", "kserve_v2.metrics", name="InferenceMetrics")
    service_module = _first("kserve_v2.service.inference_service", "kserve_v2.service")
    InferenceService, ServerState = service_module.InferenceService, service_module.ServerState
    build_app = _first("transcoding.app", "transcoding.http_app", "transcoding.rest", name="build_app")

    manager = ModelManager([source / "examples" / "model_repository"], 0, lambda: None, ready_when_empty=True)
    await manager.load_startup_models(["simple", "identity_fp32"])
    state = ServerState(False)
    state.started = True
    registry = CollectorRegistry()
    service = InferenceService(manager, state, "in-process", "explicit", InferenceMetrics(registry))
    app = build_app(service, 64 << 20, registry)

    wire = perf_analyzer_request(pb)

    handler = _model_infer_handler(servicer_module, pb_grpc, service)
    deserialize = handler.request_deserializer or (lambda data: data)  # none: the handler takes bytes
    serialize = handler.response_serializer or (lambda message: message)
    context = _Context()

    async def grpc_call() -> None:
        serialize(await handler.unary_unary(deserialize(wire), context))

    big = pb.ModelInferRequest(model_name="identity_fp32")
    big.inputs.add(name="INPUT0", datatype="FP32", shape=[1, IDENTITY_ELEMENTS])
    big.raw_input_contents.append(np.ones(IDENTITY_ELEMENTS, np.float32).tobytes())
    big_wire = big.SerializeToString()
    del big

    async def identity_call() -> None:
        serialize(await handler.unary_unary(deserialize(big_wire), context))

    headers = [(b"host", b"127.0.0.1"), (b"content-length", str(len(BODY)).encode()), (b"accept", b"*/*")]
    statuses: list[object] = []

    async def rest_call() -> None:
        await _post(app, headers, statuses)

    bare = application(prepared(source / "examples" / "model_repository"))

    async def bare_call() -> None:
        await _post(bare, headers, [])

    results = {}
    half = max(requests // 2, 1)
    for label, call, count, warm, unit in (("grpc", grpc_call, requests, WARM_UP, 1e6),
                                           ("rest", rest_call, half, WARM_UP, 1e6),
                                           ("bare", bare_call, half, WARM_UP, 1e6),
                                           ("identity", identity_call, max(requests // 1000, 2), 3, 1e3)):
        for _ in range(warm):
            await call()
            await asyncio.sleep(0)
        began = time.process_time()
        for _ in range(count):
            await call()
            await asyncio.sleep(0)
        results[label] = (time.process_time() - began) / count * unit
    if set(statuses) != {200}:
        raise SystemExit(f"REST answered {sorted(set(statuses))}, not 200")
    return results


def perf_analyzer_request(pb: Any, model: str = "simple") -> bytes:
    """The ModelInferRequest perf_analyzer sends to ``simple`` (or a model with its interface),
    serialized with ``pb`` (a checkout's ``grpc_service_pb2``)."""
    message = pb.ModelInferRequest(model_name=model)
    message.parameters["triton_enable_empty_final_response"].bool_param = True  # as perf_analyzer sends
    for name, data in (("INPUT0", np.arange(16, dtype="<i4")), ("INPUT1", np.ones(16, "<i4"))):
        message.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        message.raw_input_contents.append(data.tobytes())
    for name in ("OUTPUT0", "OUTPUT1"):
        message.outputs.add(name=name)
    return bytes(message.SerializeToString())


async def _post(app: Any, headers: list[tuple[bytes, bytes]], statuses: list[object]) -> None:
    """One POST of BODY to /v2/models/simple/infer straight into the ASGI ``app``; its status goes
    to ``statuses``."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/v2/models/simple/infer", "raw_path": b"/v2/models/simple/infer",
             "query_string": b"", "root_path": "", "headers": headers, "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 8000)}
    messages = [{"type": "http.request", "body": BODY, "more_body": False}]

    async def receive() -> dict[str, object]:
        return messages.pop() if messages else {"type": "http.disconnect"}

    async def send(sent: dict[str, object]) -> None:
        if sent["type"] == "http.response.start":
            statuses.append(sent["status"])

    await app(scope, receive, send)


class _Context:
    """The little of grpc.aio's ServicerContext a successful ModelInfer reads."""

    def invocation_metadata(self) -> tuple[()]:
        return ()

    async def abort(self, code: object, details: str) -> None:
        raise SystemExit(f"ModelInfer failed: {code} {details}")


def _first(*modules: str, name: str = "") -> Any:
    """The first of ``modules`` this checkout has (or its attribute ``name``)."""
    for module in modules:
        try:
            found = importlib.import_module(module)
        except ImportError:
            continue
        if not name:
            return found
        if hasattr(found, name):
            return getattr(found, name)
    raise SystemExit(f"none of {modules} has {name or 'the module'}")


def _model_infer_handler(servicer_module: Any, pb_grpc: Any, service: Any) -> Any:
    """ModelInfer's handler as the server registers it, in this checkout or an older one."""
    try:
        from kserve_v2.grpc.registration import CheckedRegistration
    except ImportError:  # a checkout from before registration had its own module (--source)
        from kserve_v2.grpc.parsing import CheckedRegistration  # type: ignore[attr-defined,no-redef]
    captured: dict[str, Any] = {}

    class Capture:
        def add_registered_method_handlers(self, name: str, handlers: dict[str, Any]) -> None:
            captured.update(handlers)

        def add_generic_rpc_handlers(self, handlers: object) -> None:
            pass

    raw = getattr(servicer_module, "RAW_METHODS", None)  # absent before the wire codec
    registration = CheckedRegistration(Capture(), raw) if raw is not None else CheckedRegistration(Capture())
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer_module.Servicer(service), registration)
    return captured["ModelInfer"]


def _worker(requests: int) -> None:
    import uvloop

    print(json.dumps(uvloop.run(_measure(Path.cwd(), requests))))


def _round(source: Path, requests: int) -> dict[str, float]:
    done = subprocess.run([sys.executable, str(HERE / "in_process.py"), "--worker", "--requests", str(requests)],
                          cwd=source, env={**os.environ, "PYTHONPATH": str(source)}, capture_output=True, text=True,
                          check=True)
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000, help="gRPC calls per round (REST: half as many)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--source", type=Path, help="also measure this checkout (before/after)")
    parser.add_argument("--smoke", action="store_true", help="a few calls: checks the harness, not the speed")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.requests)
        return
    requests, rounds = (50, 1) if args.smoke else (args.requests, args.rounds)
    sources = {"this checkout": ROOT} | ({f"{args.source.name}": args.source.resolve()} if args.source else {})
    figures: dict[str, list[dict[str, float]]] = {label: [] for label in sources}
    for _ in range(rounds):
        for label, source in sources.items():
            figures[label].append(_round(source, requests))
    print("| source | gRPC handler, us / request | REST app, us / request | bare ASGI app, us / request "
          "| REST app / bare app | gRPC identity 16 MiB, ms / request |")
    print("|---|---|---|---|---|---|")
    for label, values in figures.items():
        cells = [f"{statistics.median(v[path] for v in values):.1f} (rounds: "
                 f"{', '.join(f'{v[path]:.1f}' for v in values)})" for path in ("grpc", "rest", "bare", "identity")]
        ratio = statistics.median(v["rest"] / v["bare"] for v in values)
        print(f"| {label} | {cells[0]} | {cells[1]} | {cells[2]} | {ratio:.1f} | {cells[3]} |")


if __name__ == "__main__":
    main()
