"""The README's tour, run as written: every code block under its "Tour" heading, against a real server
on the example repository with the text models of `make models`.

The blocks are read from README.md at test time, so a tour that drifts from the server fails here.
Only the addresses change: the README's localhost:8001 and localhost:8000 become this server's ports,
and ``.venv/bin/python`` this interpreter. Each curl fails on an HTTP error (``--fail-with-body``).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from helpers import EXAMPLES, ROOT, Server, TextModels, start_server

BLOCK = re.compile(r"^```(bash|python)\n(.*?)^```", re.M | re.S)


def tour_blocks() -> list[tuple[str, str]]:
    """(language, code) of every fenced block in the README's "Tour" section, in order."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = re.search(r"^## Tour\b.*?(?=^## )", readme, re.M | re.S)
    assert section, "the README has no '## Tour' section"
    return BLOCK.findall(section.group(0))


@pytest.fixture(scope="module")
def tour_server(tmp_path_factory: pytest.TempPathFactory, text_models: TextModels) -> Iterator[Server]:
    """The example repository with `make models`' text models beside it, as the tour has it."""
    repository = text_models.link_into(tmp_path_factory.mktemp("tour-repo"))
    for model in EXAMPLES.iterdir():
        if model.is_dir():
            (repository / model.name).symlink_to(model, target_is_directory=True)
    server = start_server(repository, tmp_path_factory.mktemp("logs"))
    yield server
    assert server.stop() == 0


def run_block(language: str, code: str, server: Server) -> str:
    code = code.replace("localhost:8001", server.url).replace("localhost:8000", server.http_url)
    if language == "python":
        command = [sys.executable, "-c", code]
    else:
        prelude = 'set -euo pipefail\ncurl() { command curl -sS --fail-with-body "$@"; echo; }\n'
        command = ["bash", "-c", prelude + code.replace(".venv/bin/python", sys.executable)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{language} block failed:\n{code}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_tour_has_one_grpc_one_rest_and_one_embeddings_block() -> None:
    blocks = tour_blocks()
    assert [language for language, _ in blocks] == ["python", "bash", "bash"]
    assert "tritonclient.grpc" in blocks[0][1]
    assert "/v2/models/simple/infer" in blocks[1][1]
    assert "/v1/embeddings" in blocks[2][1]


def test_every_tour_block_runs_and_answers_as_the_readme_says(tour_server: Server) -> None:
    (_, grpc), (_, rest), (_, embeddings) = tour_blocks()
    sums = "[[ 1  2  3  4  5  6  7  8  9 10 11 12 13 14 15 16]]"
    assert run_block("python", grpc, tour_server).splitlines()[-1] == sums

    answers = [json.loads(line) for line in run_block("bash", rest, tour_server).splitlines() if line.strip()]
    assert answers[0] == {"ready": True}
    outputs = {output["name"]: output["data"] for output in answers[-1]["outputs"]}
    assert outputs == {"OUTPUT0": list(range(1, 17)), "OUTPUT1": list(range(-1, 15))}

    body = json.loads(run_block("bash", embeddings, tour_server).strip().splitlines()[-1])
    assert body["model"] == "all-MiniLM-L6-v2" and body["object"] == "list"
    assert [len(item["embedding"]) for item in body["data"]] == [384, 384]
