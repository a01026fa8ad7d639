"""The REST ceiling: a bare ASGI app on uvicorn + httptools + uvloop that does only the protocol work.

POST /v2/models/{model}/infer reads the body, ``json.loads`` its JSON part and answers: `simple`
with a response prepared at start (JSON data), `identity_fp32` with its binary input echoed as a
binary output (Triton's binary tensor data extension). Metadata, config and statistics routes
answer prepared JSON so perf_analyzer can drive it; statistics give the number of infer requests
answered as the success count (``cpu_per_request.py`` divides by it). No routing table,
middleware or validation.

``--workers N`` runs N such processes on the port (``SO_REUSEPORT``), as ``kserve-v2 --workers N`` does.

Usage: python benchmarks/ceiling_rest.py --port N --repository examples/model_repository [--workers N]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import uvicorn

from ceiling_grpc import configs, metadata  # sibling module
from kserve_v2._proto import grpc_service_pb2 as pb
from kserve_v2.protocol.json_pb import message_to_json
from processes import fork_workers  # sibling module

JSON = [(b"content-type", b"application/json")]


def prepared(repository: Path) -> dict[str, bytes]:
    """GET answers by path, and `simple`'s infer answer (key ``simple``)."""
    answers: dict[str, bytes] = {}
    for name, config in configs(repository).items():
        answers[f"/v2/models/{name}"] = json.dumps(message_to_json(metadata(config))).encode()
        answers[f"/v2/models/{name}/config"] = json.dumps(message_to_json(config)).encode()
        answers[f"/v2/models/{name}/ready"] = b""
    answers["/v2/health/ready"] = answers["/v2/health/live"] = b""
    answers["/v2"] = json.dumps({"name": "ceiling", "version": "0", "extensions": []}).encode()
    answers["simple"] = json.dumps({"model_name": "simple", "model_version": "1", "outputs": [
        {"name": name, "datatype": "INT32", "shape": [1, 16], "data": list(range(16))} for name in ("OUTPUT0", "OUTPUT1")
    ]}, separators=(",", ":")).encode()
    return answers


def statistics(name: str, answered: int) -> bytes:
    """Statistics of one model: ``answered`` successes."""
    stats = pb.ModelStatisticsResponse()
    stats.model_stats.add(name=name, version="1").inference_stats.success.count = answered
    return json.dumps(message_to_json(stats)).encode()


def application(answers: dict[str, bytes]):
    answered = [0]

    async def app(scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        if scope["method"] == "GET":
            parts = path.split("/")  # /v2/models/<name>/stats or /v2/models/<name>/versions/1/stats
            body = statistics(parts[3], answered[0]) if path.endswith("/stats") and len(parts) > 3 else answers.get(path)
            await send({"type": "http.response.start", "status": 200 if body is not None else 404, "headers": JSON})
            await send({"type": "http.response.body", "body": body or b""})
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        data = b"".join(chunks)
        answered[0] += 1
        length = dict(scope["headers"]).get(b"inference-header-content-length")
        split = int(length) if length else len(data)
        header = json.loads(data[:split])
        if path.endswith("/simple/infer"):
            await send({"type": "http.response.start", "status": 200, "headers": JSON})
            await send({"type": "http.response.body", "body": answers["simple"]})
            return
        tensor = header["inputs"][0]
        out = json.dumps({"model_name": "identity_fp32", "model_version": "1", "outputs": [
            {"name": "OUTPUT0", "datatype": "FP32", "shape": tensor["shape"],
             "parameters": {"binary_data_size": len(data) - split}}]}, separators=(",", ":")).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"application/octet-stream"), (b"inference-header-content-length", str(len(out)).encode())]})
        await send({"type": "http.response.body", "body": out, "more_body": True})
        await send({"type": "http.response.body", "body": memoryview(data)[split:]})

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--repository", type=Path, required=True)
    parser.add_argument("--workers", type=int, default=1, help="processes sharing the port")
    args = parser.parse_args()
    from kserve_v2.host.ports import shared_socket  # here: benchmarks/in_process.py imports this module with older checkouts

    fork_workers(args.workers)
    print(f"ceiling REST listening on 127.0.0.1:{args.port}", flush=True)
    config = uvicorn.Config(application(prepared(args.repository)), http="httptools", loop="uvloop", lifespan="off",
                            log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[shared_socket("127.0.0.1", args.port)])


if __name__ == "__main__":
    main()
