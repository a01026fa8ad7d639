"""CPU time of an ensemble's steps, in-process: what one step of an ensemble costs on top of the
request to its model.

An ensemble of ``--steps`` ONNX ``Identity`` steps in a chain, and one of a single step, answer the
same request (FP32, a small tensor of 16 elements and a large one of 1 MiB) through
``InferenceService.model_infer_reported``, the call every transport makes; the identity model
answers it directly too. Each figure is the process CPU time of many calls divided by their number:
- direct: the request to the identity model itself (the floor of one step);
- per step: (chain - single) / (steps - 1), what each further step adds;
- step overhead: per step - direct, what the ensemble adds to each step's own request (building the
  step's request and reading its response).
No network, no transport: only the service, the schedulers and the model.

``--source DIR`` measures another checkout as well (``git worktree add /tmp/before main``), each in
its own process, rounds alternating, to compare before and after in one sitting.

Usage: python benchmarks/ensemble_steps.py [--requests 2000] [--steps 8] [--rounds 3] [--source DIR] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SIZES = {"16 floats": 16, "1 MiB": 1 << 18}  # elements of the FP32 tensor
WARM_UP = 50


def _repository(folder: Path, steps: int) -> None:
    """``identity`` (ONNX Identity, FP32 [-1], no batching), ``single`` (one step of it) and
    ``chain`` (``steps`` steps of it, each fed by the one before)."""
    import onnx
    from onnx import TensorProto, helper

    tensor = 'data_type: TYPE_FP32 dims: [ -1 ]'
    (folder / "identity" / "1").mkdir(parents=True)
    graph = helper.make_graph([helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], "identity",
                              [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [None])],
                              [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(folder / "identity" / "1" / "model.onnx"))
    (folder / "identity" / "config.pbtxt").write_text(
        f'name: "identity" backend: "onnxruntime" max_batch_size: 0\n'
        f'input [ {{ name: "INPUT0" {tensor} }} ] output [ {{ name: "OUTPUT0" {tensor} }} ]\n')
    for name, count in (("single", 1), ("chain", steps)):
        names = ["INPUT0", *(f"t{i}" for i in range(1, count)), "OUTPUT0"]
        chained = ", ".join(f'{{ model_name: "identity" model_version: -1 input_map {{ key: "INPUT0" value: "{a}" }} '
                            f'output_map {{ key: "OUTPUT0" value: "{b}" }} }}' for a, b in itertools.pairwise(names))
        (folder / name / "1").mkdir(parents=True)
        (folder / name / "config.pbtxt").write_text(
            f'name: "{name}" platform: "ensemble" max_batch_size: 0\n'
            f'input [ {{ name: "INPUT0" {tensor} }} ] output [ {{ name: "OUTPUT0" {tensor} }} ]\n'
            f'ensemble_scheduling {{ step [ {chained} ] }}\n')


async def _measure(requests: int, steps: int) -> dict[str, float]:
    """us of CPU per request of each model and size, with the checkout first on sys.path."""
    import numpy as np

    from kserve_v2._proto import grpc_service_pb2 as pb
    from kserve_v2.codec.requests import decode_request
    from kserve_v2.repository.manager import ModelManager
    from kserve_v2.service.inference_service import InferenceService, ServerState

    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        _repository(folder, steps)
        manager = ModelManager([folder], 0, lambda: None, ready_when_empty=True)
        state = ServerState(False)
        state.started = True
        service = InferenceService(manager, state, "in-process", "explicit")  # sets the steps' call first
        await manager.load_startup_models(["identity", "single", "chain"])
        for size, elements in SIZES.items():
            count = requests if elements < 1024 else max(requests // 20, 2)
            for model in ("identity", "single", "chain"):
                message = pb.ModelInferRequest(model_name=model)
                message.inputs.add(name="INPUT0", datatype="FP32", shape=[elements])
                message.raw_input_contents.append(np.ones(elements, np.float32).tobytes())
                request = decode_request(message.SerializeToString())
                for _ in range(WARM_UP):
                    await service.model_infer_reported(request)
                began = time.process_time()
                for _ in range(count):
                    await service.model_infer_reported(request)
                    await asyncio.sleep(0)
                results[f"{model} {size}"] = (time.process_time() - began) / count * 1e6
    return results


def _round(source: Path, requests: int, steps: int) -> dict[str, float]:
    done = subprocess.run([sys.executable, str(HERE / "ensemble_steps.py"), "--worker", "--requests", str(requests),
                           "--steps", str(steps)], cwd=source, env={**os.environ, "PYTHONPATH": str(source)},
                          capture_output=True, text=True, check=True)
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _cell(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} (rounds: {', '.join(f'{v:.1f}' for v in values)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests per model and round (1 MiB: 1/20 of it)")
    parser.add_argument("--steps", type=int, default=8, help="steps of the chained ensemble")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--source", type=Path, help="also measure this checkout (before/after)")
    parser.add_argument("--smoke", action="store_true", help="a few calls: checks the harness, not the speed")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(asyncio.run(_measure(args.requests, args.steps))))
        return
    requests, rounds = (40, 1) if args.smoke else (args.requests, args.rounds)
    sources = {"this checkout": ROOT} | ({f"{args.source.name}": args.source.resolve()} if args.source else {})
    figures: dict[str, list[dict[str, float]]] = {label: [] for label in sources}
    for _ in range(rounds):
        for label, source in sources.items():
            figures[label].append(_round(source, requests, args.steps))
    print(f"| source | tensor | direct, us / request | {args.steps} steps, us / request | per step, us "
          "| step overhead, us |")
    print("|---|---|---|---|---|---|")
    for label, values in figures.items():
        for size in SIZES:
            per_step = [(v[f"chain {size}"] - v[f"single {size}"]) / (args.steps - 1) for v in values]
            overhead = [step - v[f"identity {size}"] for step, v in zip(per_step, values, strict=True)]
            print(f"| {label} | {size} | {_cell([v[f'identity {size}'] for v in values])} "
                  f"| {_cell([v[f'chain {size}'] for v in values])} | {_cell(per_step)} | {_cell(overhead)} |")
    if args.source:
        for size in SIZES:
            ratio = [statistics.median((v[f"chain {size}"] - v[f"single {size}"]) for v in figures[label])
                     for label in sources]
            print(f"per step, {size}: this checkout / {args.source.name} = {ratio[0] / ratio[1]:.2f}")


if __name__ == "__main__":
    main()
