"""``KSERVE_V2_MODEL_REPOSITORY``: ``:``-separated folders and object-store URLs, each URL kept whole."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from kserve_v2.cli import parse_settings
from kserve_v2.repository import remote


@pytest.mark.skipif(importlib.util.find_spec("s3fs") is None, reason="s3fs is not installed (kserve_v2[s3])")
def test_the_variable_takes_folders_and_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = "s3://127.0.0.1:9000/bucket/repo"
    monkeypatch.setenv("KSERVE_V2_MODEL_REPOSITORY", f"{tmp_path}:{url}")
    local, mirror = parse_settings(["serve"]).model_repositories
    assert local == tmp_path
    store = remote.mirrored(mirror)
    assert store is not None and store.location.url == url and store.location.endpoint == "http://127.0.0.1:9000"


def test_a_bad_url_in_the_variable_is_a_usage_error(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("KSERVE_V2_MODEL_REPOSITORY", "/models:as://account-only")
    with pytest.raises(SystemExit):
        parse_settings(["serve"])
    assert "KSERVE_V2_MODEL_REPOSITORY: model repository 'as://account-only': Azure URLs are" in capsys.readouterr().err
