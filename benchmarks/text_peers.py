"""Text serving side by side: this server, infinity-emb 0.0.78 and fastembed 0.9.1 on the same MiniLM ONNX files.

- ours: `/v1/embeddings` on all-MiniLM-L6-v2 and `/v1/rerank` on minilm-reranker (the cross-encoder
  examples/build_cross_encoder.py builds around the same MiniLM file);
- infinity-emb 0.0.78 with its `optimum` engine on CPU, the same two files in scratch model folders
  (one `.onnx` each; one infinity process per model), `--pooling-method mean`, `--url-prefix /v1`,
  `HF_HUB_OFFLINE=1`; its own environment in the user's cache folder (torch==2.13.0, the CPU build,
  first);
- fastembed 0.9.1 in process on the embedding file (`specific_model_path`), in its own environment
  (benchmarks/fastembed_peer.py): the ceiling of "no server at all".

Everything runs on the first 2 CPUs (`--cpus`). Both servers run at once and are measured case by
case, back to back, by the same client (httpx, one connection per caller, closed loop): embeddings
of batches of 1 (4 callers) and 32 (1 caller) texts, short (about 12 tokens) and 256 tokens;
rerank of 32 documents (1 caller). Each case is measured ``--rounds`` times, the servers' order
alternating from round to round; a cell is the round with the median texts/s: texts/s
(p50 / p99 ms), and a ratio to infinity is the median of the rounds' ratios (each round measures
both servers minutes apart at most, so a change in the machine's load moves both). fastembed runs
once per round after the servers have stopped; its ratios (ours / fastembed, and fastembed /
infinity: how far past infinity the file goes with no server at all) are of the median cells. Then the cosine
of our vectors to each peer's and the largest difference of the
rerank scores, and the issue's targets. Models come from ../shared/models (or examples/model_repository
after `make models`).

``--openvino`` serves ours on ONNX Runtime's OpenVINO execution provider (`cpu_execution_accelerator`
`openvino` in the scratch copies' configs, onnxruntime-openvino from `make openvino` ahead on our
server's PYTHONPATH); the peers keep ONNX Runtime's CPU provider.

Usage: python benchmarks/text_peers.py [--seconds 10] [--rounds 3] [--smoke] [--skip-infinity] [--skip-fastembed]
                                     [--peers-if-cached] [--cpus 2] [--openvino]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
from tokenizers import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cache import cache_dir  # noqa: E402 - sibling module
from perf import ROOT, start_server  # noqa: E402 - the sibling benchmark's server launcher
from processes import wait_http  # noqa: E402 - sibling module

HERE = Path(__file__).resolve().parent
MINILM, RERANKER = "all-MiniLM-L6-v2", "minilm-reranker"
OPENVINO_ORT = ROOT / ".venv" / "openvino-ort"  # `make openvino`
OPENVINO_CONFIG = 'optimization { execution_accelerators { cpu_execution_accelerator: [{ name: "openvino" }] } }\n'
# (cache folder name, pip install steps): torch first, so pip takes the CPU build, not the CUDA one
INFINITY = ("infinity-emb-0.0.78", [["torch==2.13.0"], ["infinity-emb[server,optimum]==0.0.78", "optimum==2.1.0",
                                                         "optimum-onnx==0.1.0", "transformers==4.57.6"]])
FASTEMBED = ("fastembed-0.9.1", [["fastembed==0.9.1"]])
WORDS = ("the quick brown fox jumps over a lazy dog while seven bright students read long books about "
         "distant mountains rivers cities and the history of science in quiet libraries every evening").split()
SPECIAL_TOKENS = {"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "unk_token": "[UNK]",
                  "mask_token": "[MASK]"}


@dataclass(frozen=True)
class Case:
    label: str
    route: str  # embeddings | rerank
    batch: int  # texts (documents) per request
    tokens: int  # tokens per text, special tokens included (short texts: about 12)
    callers: int


CASES = (
    Case("embeddings 1 x short", "embeddings", 1, 12, 4),
    Case("embeddings 32 x short", "embeddings", 32, 12, 1),
    Case("embeddings 1 x 256 tokens", "embeddings", 1, 256, 4),
    Case("embeddings 32 x 256 tokens", "embeddings", 32, 256, 1),
    Case("rerank 32 x short", "rerank", 32, 12, 1),
    Case("rerank 32 x 256 tokens", "rerank", 32, 256, 1),
)
QUERY = "which students read books about the history of science"


def peer_env(name: str, steps: list[list[str]], create: bool) -> Path | None:
    """The peer's virtual environment in the cache folder, installed on first use; None when it is
    missing and ``create`` is false."""
    env = cache_dir(name)
    if (env / ".installed").exists():
        return env
    if not create:
        return None
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(env)], check=True)
    for step in steps:
        subprocess.run([str(env / "bin" / "pip"), "install", "-q", *step], check=True)
    (env / ".installed").touch()
    return env


def texts(tokenizer: Tokenizer, count: int, tokens: int, seed: int) -> list[str]:
    """``count`` texts of exactly ``tokens`` tokens (special tokens included), or of about 10 words when short."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        if tokens <= 16:
            out.append(" ".join(rng.choice(WORDS, size=10)).capitalize() + ".")
            continue
        text = " ".join(rng.choice(WORDS, size=tokens * 2))
        offsets = tokenizer.encode(text, add_special_tokens=False).offsets
        out.append(text[:offsets[tokens - 3][1]])  # tokens - 2 words' tokens, then [CLS] and [SEP]
    return out


def model_files() -> tuple[Path, Path, tempfile.TemporaryDirectory]:
    """(a repository with MiniLM and minilm-reranker, its folder for the peers' copies, the scratch folder)."""
    scratch = tempfile.TemporaryDirectory(prefix="text-peers-")
    repository = Path(scratch.name) / "repository"
    shared = ROOT.parent / "shared" / "models"
    if (shared / MINILM).is_dir():
        subprocess.run([sys.executable, str(ROOT / "examples" / "fetch_text_models.py"), "--shared", str(shared),
                        "--repository", str(repository), "--link", "--cross-encoder"], check=True, capture_output=True)
    else:
        examples = ROOT / "examples" / "model_repository"
        if not all((examples / name / "1" / "model.onnx").is_file() for name in (MINILM, RERANKER)):
            sys.exit("no all-MiniLM-L6-v2 (fp32) and minilm-reranker: keep ../shared beside the project or run `make models`")
        repository = examples
    return repository, Path(scratch.name), scratch


def peer_folder(version: Path, target: Path, max_length: int) -> Path:
    """A Hugging Face style folder holding one .onnx (a link to ``version``'s), config.json and the tokenizer files."""
    target.mkdir(parents=True)
    (target / "model.onnx").symlink_to((version / "model.onnx").resolve())
    shutil.copyfile(version / "tokenizer.json", target / "tokenizer.json")
    config = json.loads((version / "config.json").read_text())
    (target / "config.json").write_text(json.dumps(config))
    (target / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer", "do_lower_case": True,
                                                              "model_max_length": max_length, **SPECIAL_TOKENS}))
    (target / "special_tokens_map.json").write_text(json.dumps(SPECIAL_TOKENS))
    return target


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_infinity(env: Path, folder: Path, name: str, log: Path) -> tuple[subprocess.Popen, str]:
    """infinity_emb serving ``folder`` as ``name``. It runs in the folder with model id ``.``:
    infinity 0.0.78 hands optimum the .onnx file's path as found under the model id, and optimum 2
    looks for that name among the folder's files, so only a model id of ``.`` gives a name it finds."""
    port = free_port()
    command = [str(env / "bin" / "infinity_emb"), "v2", "--host", "127.0.0.1", "--port", str(port), "--url-prefix", "/v1",
               "--model-id", ".", "--served-model-name", name, "--pooling-method", "mean", "--engine", "optimum",
               "--device", "cpu"]
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0", "DO_NOT_TRACK": "1"}
    proc = subprocess.Popen(command, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=environment, cwd=folder)
    wait_http(proc, f"http://127.0.0.1:{port}/v1/models", log, f"infinity-emb ({name})", seconds=300)
    return proc, f"http://127.0.0.1:{port}"


def body(case: Case, batch: list[str]) -> dict[str, object]:
    if case.route == "rerank":
        return {"model": RERANKER, "query": QUERY, "documents": batch}
    return {"model": MINILM, "input": batch}


def drive(base: str, case: Case, batches: list[list[str]], seconds: float) -> dict[str, float] | str:
    """Closed loop: ``case.callers`` callers for ``seconds``; texts/s and p50/p99 ms, or the first error."""
    latencies: list[float] = []
    errors: list[str] = []
    url = f"{base}/v1/{case.route}"

    def caller(offset: int) -> None:
        with httpx.Client(timeout=300) as client:
            deadline, sent = time.perf_counter() + seconds, offset
            while (time.perf_counter() < deadline or not latencies) and not errors:
                began = time.perf_counter()
                reply = client.post(url, json=body(case, batches[sent % len(batches)]))
                if reply.status_code != 200:
                    errors.append(f"HTTP {reply.status_code}: {reply.text[:80]}")
                    return
                latencies.append(time.perf_counter() - began)
                sent += 1

    with httpx.Client(timeout=300) as warm:
        reply = warm.post(url, json=body(case, batches[0]))
        if reply.status_code != 200:
            return f"fails: HTTP {reply.status_code}: {reply.text[:80]}"
    started = time.perf_counter()
    with ThreadPoolExecutor(case.callers) as pool:
        list(pool.map(caller, range(case.callers)))
    elapsed = time.perf_counter() - started
    if errors:
        return f"fails: {errors[0]}"
    p50, p99 = np.percentile(latencies, [50, 99]) * 1000
    return {"texts/s": len(latencies) * case.batch / elapsed, "p50 ms": float(p50), "p99 ms": float(p99)}


def vectors(base: str, probe: list[str]) -> np.ndarray:
    reply = httpx.post(f"{base}/v1/embeddings", json={"model": MINILM, "input": probe}, timeout=300)
    reply.raise_for_status()
    return np.array([item["embedding"] for item in sorted(reply.json()["data"], key=lambda d: d["index"])], dtype=np.float32)


def rerank_scores(base: str, documents: list[str]) -> np.ndarray:
    reply = httpx.post(f"{base}/v1/rerank", json={"model": RERANKER, "query": QUERY, "documents": documents}, timeout=300)
    reply.raise_for_status()
    scores = np.zeros(len(documents), dtype=np.float32)
    for result in reply.json()["results"]:
        scores[result["index"]] = result["relevance_score"]
    return scores


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float((a * b).sum(axis=1).min())


def fastembed(env: Path, folder: Path, cases: dict[str, list[list[str]]], probe: list[str], seconds: float) -> dict:
    job = {"folder": str(folder), "threads": len(os.sched_getaffinity(0)), "seconds": seconds, "probe": probe,
           "cases": [{"label": label, "texts": batches} for label, batches in cases.items()]}
    done = subprocess.run([str(env / "bin" / "python"), str(HERE / "fastembed_peer.py")], input=json.dumps(job),
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1][:120] if done.stderr.strip() else f"exit {done.returncode}"}
    result: dict = json.loads(done.stdout.strip().splitlines()[-1])
    return result


Figure = dict[str, float] | str


def median_round(rounds: list[Figure]) -> Figure:
    """The round with the median texts/s (the lower middle of an even count), or the first failure."""
    failed = [value for value in rounds if isinstance(value, str)]
    if failed:
        return failed[0]
    ranked = sorted((value for value in rounds if isinstance(value, dict)), key=lambda value: value["texts/s"])
    return ranked[(len(ranked) - 1) // 2]


def median_ratio(ours: list[Figure], theirs: list[Figure]) -> float | None:
    """The median over rounds of ours / theirs, each round's pair measured back to back."""
    ratios = [r for r in map(ratio, ours, theirs) if r is not None]
    return float(np.median(ratios)) if ratios and len(ratios) == len(ours) else None


def cell(value: dict[str, float] | str | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return f"{value['texts/s']:,.1f} ({value['p50 ms']:.1f} / {value['p99 ms']:.1f})"


def ratio(ours: dict[str, float] | str | None, theirs: dict[str, float] | str | None) -> float | None:
    if isinstance(ours, dict) and isinstance(theirs, dict) and theirs["texts/s"]:
        return ours["texts/s"] / theirs["texts/s"]
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10, help="measurement window per case and server")
    parser.add_argument("--rounds", type=int, default=3, help="measurements of each case and server (median)")
    parser.add_argument("--smoke", action="store_true", help="short windows, one round: checks the harness, not the speed")
    parser.add_argument("--skip-infinity", action="store_true")
    parser.add_argument("--skip-fastembed", action="store_true")
    parser.add_argument("--peers-if-cached", action="store_true",
                        help="run a peer only when its environment is already in the cache (no download)")
    parser.add_argument("--cpus", type=int, default=2,
                        help="run everything (servers, fastembed, the client) on the first N CPUs (the issue's 2 cores)")
    parser.add_argument("--openvino", action="store_true",
                        help="ours on the OpenVINO execution provider (needs `make openvino` and ../shared/models)")
    args = parser.parse_args()
    if args.openvino and not (OPENVINO_ORT / "onnxruntime").is_dir():
        sys.exit("--openvino: run `make openvino` first")
    cpus = sorted(os.sched_getaffinity(0))[:args.cpus]
    os.sched_setaffinity(0, cpus)  # inherited by every process started below
    seconds = 0.5 if args.smoke else args.seconds
    rounds = 1 if args.smoke else max(args.rounds, 1)
    create = not args.peers_if_cached
    infinity_env = None if args.skip_infinity else peer_env(*INFINITY, create=create)
    fastembed_env = None if args.skip_fastembed else peer_env(*FASTEMBED, create=create)
    repository, work, scratch = model_files()
    if args.openvino:
        if repository == ROOT / "examples" / "model_repository":
            sys.exit("--openvino edits the models' configs, so it runs on the scratch copy of ../shared/models only")
        for name in (MINILM, RERANKER):
            with open(repository / name / "config.pbtxt", "a") as config:
                config.write(OPENVINO_CONFIG)
    tokenizer = Tokenizer.from_file(str(repository / MINILM / "1" / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    batches = {case.label: [texts(tokenizer, case.batch, case.tokens, seed) for seed in range(2 if args.smoke else 8)]
               for case in CASES}
    probe = texts(tokenizer, 6, 12, 100) + texts(tokenizer, 2, 256, 101)
    measured: dict[tuple[str, str], list[Figure]] = {}
    checks: list[str] = []
    running: list[subprocess.Popen] = []
    try:
        ours, ports = start_server(repository, work / "ours.log", "--model-control-mode", "explicit",
                                   "--load-model", MINILM, "--load-model", RERANKER,
                                   path=OPENVINO_ORT if args.openvino else None)
        running.append(ours)
        if args.openvino and (work / "ours.log").read_text().count("runs on OpenVINOExecutionProvider") != 2:
            sys.exit(f"--openvino: the models did not load on OpenVINO:\n{(work / 'ours.log').read_text()}")
        # server -> route -> base URL (infinity: one process per model, see start_infinity)
        ours_base = f"http://127.0.0.1:{ports['http']}"
        servers = {"ours": {"embeddings": ours_base, "rerank": ours_base}}
        peers = work / "peers"
        embedder = peer_folder(repository / MINILM / "1", peers / MINILM, 256)
        if infinity_env is not None:
            reranker = peer_folder(repository / RERANKER / "1", peers / RERANKER, 512)
            servers["infinity"] = {}
            for route, folder, name in (("embeddings", embedder, MINILM), ("rerank", reranker, RERANKER)):
                proc, servers["infinity"][route] = start_infinity(infinity_env, folder, name, work / f"infinity-{route}.log")
                running.append(proc)
        for case in CASES:
            for round_ in range(rounds):
                order = list(servers.items()) if round_ % 2 == 0 else list(reversed(servers.items()))
                for server, bases in order:
                    value = drive(bases[case.route], case, batches[case.label], seconds)
                    measured.setdefault((server, case.label), []).append(value)
        ours_vectors = vectors(ours_base, probe)
        if "infinity" in servers:
            checks.append(f"cosine ours / infinity (min over {len(probe)} texts): "
                          f"{min_cosine(ours_vectors, vectors(servers['infinity']['embeddings'], probe)):.6f}")
            theirs, how = rerank_scores(servers["infinity"]["rerank"], probe), ""
            if theirs.min() < 0 or theirs.max() > 1:  # raw logits: the activation the model's config.json names
                theirs, how = 1 / (1 + np.exp(-theirs)), ", infinity's logits through sigmoid"
            difference = np.abs(rerank_scores(ours_base, probe) - theirs)
            checks.append(f"rerank scores ours - infinity (largest difference over {len(probe)} documents{how}): "
                          f"{float(difference.max()):.2e}")
    finally:
        for proc in running:
            proc.terminate()
        for proc in running:
            proc.wait(60)
    if fastembed_env is not None:
        embedding_cases = {case.label: batches[case.label] for case in CASES if case.route == "embeddings"}
        peer_probe = None  # fastembed's vectors of the probe texts, from its first round that ran
        for _ in range(rounds):
            peer = fastembed(fastembed_env, embedder, embedding_cases, probe, seconds)
            if "error" in peer:
                for label in embedding_cases:
                    measured.setdefault(("fastembed", label), []).append(f"fails: {peer['error']}")
                continue
            for label, value in peer["cases"].items():
                measured.setdefault(("fastembed", label), []).append(value)
            peer_probe = peer_probe or peer["probe"]
        if peer_probe is not None:
            checks.append(f"cosine ours / fastembed (min over {len(probe)} texts): "
                          f"{min_cosine(ours_vectors, np.array(peer_probe, dtype=np.float32)):.6f}")
    figures = {key: median_round(values) for key, values in measured.items()}
    infinity_ratios = {case.label: median_ratio(measured.get(("ours", case.label), []),
                                                measured.get(("infinity", case.label), []))
                       for case in CASES if ("infinity", case.label) in measured}
    scratch.cleanup()
    print(f"Cells: texts/s (p50 / p99 ms per request), the median of {rounds} round(s); ours and infinity-emb 0.0.78 "
          "over HTTP by one client, fastembed 0.9.1 in process; ours / infinity: the median of the rounds' ratios; "
          "fastembed / infinity: what the same file gives with no server at all.")
    print("| case | ours | infinity-emb | fastembed (in process) | ours / infinity | ours / fastembed | fastembed / infinity |")
    print("|---|---|---|---|---|---|---|")
    for case in CASES:
        ours_cell, fastembed_cell = figures.get(("ours", case.label)), figures.get(("fastembed", case.label))
        versus = [infinity_ratios.get(case.label), ratio(ours_cell, fastembed_cell),
                  ratio(fastembed_cell, figures.get(("infinity", case.label)))]
        print(f"| {case.label} | {cell(ours_cell)} | {cell(figures.get(('infinity', case.label)))} "
              f"| {cell(fastembed_cell)} | "
              + " | ".join("n/a" if r is None else f"{r:.2f}" for r in versus) + " |")
    for line in checks:
        print(line)
    print(targets(figures, infinity_ratios))


def targets(figures: dict[tuple[str, str], Figure], infinity_ratios: dict[str, float | None]) -> str:
    """The issue's targets, met or missed, from the table's figures and ratios (three decimals, so
    that a miss such as 1.196 does not print as the 1.20 it rounds to)."""
    lines = []
    for case in CASES:
        ours = figures.get(("ours", case.label))
        if case.route == "embeddings":
            infinity = infinity_ratios.get(case.label)
            lines.append(f"{case.label}: ours / infinity >= 1.2: " + ("n/a" if infinity is None else
                                                                      f"{'met' if infinity >= 1.2 else 'missed'} ({infinity:.3f})"))
            if case.batch == 32:
                ceiling = ratio(ours, figures.get(("fastembed", case.label)))
                lines.append(f"{case.label}: ours / fastembed >= 0.9: " + ("n/a" if ceiling is None else
                                                                           f"{'met' if ceiling >= 0.9 else 'missed'} ({ceiling:.3f})"))
        else:
            theirs = figures.get(("infinity", case.label))
            if isinstance(ours, dict) and isinstance(theirs, dict):
                met = "met" if ours["p50 ms"] <= theirs["p50 ms"] else "missed"
                lines.append(f"{case.label}: p50 ours <= infinity: {met} ({ours['p50 ms']:.1f} vs {theirs['p50 ms']:.1f} ms)")
            else:
                lines.append(f"{case.label}: p50 ours <= infinity: n/a")
    return "Targets:\n" + "\n".join(f"- {line}" for line in lines)


if __name__ == "__main__":
    main()
