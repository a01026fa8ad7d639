"""/v1/encode throughput on all-MiniLM-L6-v2 next to in-process ONNX Runtime + tokenizers.

Both sides embed the same batches of 32 sentences of about 20 words: the server through
`POST /v1/encode` (msgpack, one client, as SIE's clients send), the baseline in this process
with the model's tokenizer.json (truncation 256, padding to the longest), an ORT session with
default options, masked mean pooling and L2 normalisation. The baseline runs before and after
the server (its mean is the reference), and the ratio server / in-process is printed.

The model comes from ../shared/models (symlinked into a temporary repository by
examples/fetch_text_models.py) or from examples/model_repository after `make models`.
Usage: python benchmarks/encode.py [--batches 20] [--batch-size 32] [--smoke]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import msgpack
import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from perf import ROOT, start_server  # noqa: E402 - the sibling benchmark's server launcher

MODEL = "all-MiniLM-L6-v2"
WORDS = ("the quick brown fox jumps over a lazy dog while seven bright students read long books about "
         "distant mountains rivers cities and the history of science in quiet libraries every evening").split()


def sentences(count: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(17, 24)))).capitalize() + "." for _ in range(count)]


def model_folder() -> tuple[Path, tempfile.TemporaryDirectory | None]:
    """A repository holding the MiniLM adapter: ../shared/models linked in, else the example repository."""
    shared = ROOT.parent / "shared" / "models"
    if (shared / MODEL).is_dir():
        scratch = tempfile.TemporaryDirectory()
        subprocess.run([sys.executable, str(ROOT / "examples" / "fetch_text_models.py"), "--shared", str(shared),
                        "--repository", scratch.name, "--link"], check=True, capture_output=True)
        return Path(scratch.name), scratch
    examples = ROOT / "examples" / "model_repository"
    if not (examples / MODEL / "1" / "tokenizer.json").is_file():
        sys.exit("no all-MiniLM-L6-v2: keep ../shared beside the project or run `make models`")
    return examples, None


class InProcess:
    """The baseline: tokenizers + ORT + pooling in this process."""

    def __init__(self, folder: Path) -> None:
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(256)
        self.tokenizer.enable_padding()
        self.session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])

    def encode(self, batch: list[str]) -> np.ndarray:
        encodings = self.tokenizer.encode_batch(batch)
        feeds = {"input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
                 "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
                 "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64)}
        hidden = self.session.run(["last_hidden_state"], feeds)[0]
        mask = feeds["attention_mask"][..., None].astype(np.float32)
        pooled = (hidden * mask).sum(axis=1) / mask.sum(axis=1)
        return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)


def server_encode(port: int, batch: list[str]) -> np.ndarray:
    body = msgpack.packb({"items": [{"text": s} for s in batch]})
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/encode/{MODEL}", data=body,
                                     headers={"Content-Type": "application/msgpack"})
    with urllib.request.urlopen(request, timeout=300) as reply:
        items = msgpack.unpackb(reply.read())["items"]
    return np.stack([np.frombuffer(item["dense"]["values"][b"data"], dtype=np.float32) for item in items])


def items_per_second(encode, batches: list[list[str]]) -> float:
    encode(batches[0])  # warm-up
    started = time.perf_counter()
    for batch in batches:
        encode(batch)
    return sum(len(b) for b in batches) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--smoke", action="store_true", help="two batches of four: checks the harness, not the speed")
    args = parser.parse_args()
    if args.smoke:
        args.batches, args.batch_size = 2, 4
    repository, scratch = model_folder()
    batches = [sentences(args.batch_size, seed) for seed in range(args.batches)]
    local = InProcess(repository / MODEL / "1")
    with tempfile.TemporaryDirectory() as logs:
        proc, ports = start_server(repository, Path(logs) / "server.log", "--load-model", MODEL,
                                   "--model-control-mode", "explicit")
        try:
            np.testing.assert_allclose(server_encode(ports["http"], batches[0]), local.encode(batches[0]), atol=1e-4)
            before = items_per_second(local.encode, batches)
            served = items_per_second(lambda b: server_encode(ports["http"], b), batches)
            after = items_per_second(local.encode, batches)
        finally:
            proc.terminate()
            proc.wait(60)
    if scratch is not None:
        scratch.cleanup()
    baseline = (before + after) / 2
    print(f"| case ({args.batches} batches of {args.batch_size} sentences, ~20 words) | items/s |")
    print("|---|---|")
    print(f"| in-process ORT + tokenizers (before / after) | {before:.1f} / {after:.1f} |")
    print(f"| POST /v1/encode, msgpack, one client | {served:.1f} |")
    print(f"| ratio server / in-process | {served / baseline:.3f} |")


if __name__ == "__main__":
    main()
