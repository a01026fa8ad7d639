"""``--backend-config=onnxruntime,<setting>=<value>`` and ``--backend-config=default-max-batch-size=<n>``:
Triton's onnxruntime backend's command line options read and checked, and what the built-in backend
(``kserve_v2.runtime.onnx``) makes of the thread settings: ONNX Runtime's global thread pools made
once, and the session options read back."""

from __future__ import annotations

import logging

import pytest

from kserve_v2.runtime import onnx
from kserve_v2.settings.backend_config import (BackendConfig, OnnxRuntimeBackendConfig, PythonBackendConfig,
                                               parse_backend_config)


def test_the_defaults_are_tritons() -> None:
    config = parse_backend_config(())
    assert config == BackendConfig(PythonBackendConfig(), OnnxRuntimeBackendConfig(False, 0, 0, 4), 4)
    assert config.default_max_batch_size_of("onnxruntime") == config.default_max_batch_size_of("mine") == 4


def test_the_onnxruntime_settings_are_read() -> None:
    config = parse_backend_config(["onnxruntime,enable-global-threadpool=1", "onnxruntime,intra_op_thread_count=3",
                                   "onnxruntime,inter_op_thread_count=2", "onnxruntime,default-max-batch-size=16"])
    assert config.onnxruntime == OnnxRuntimeBackendConfig(True, 3, 2, 16)
    assert config.python == PythonBackendConfig()


@pytest.mark.parametrize(("value", "enabled"), [("true", True), ("ON", True), ("0", False), ("off", False)])
def test_enable_global_threadpool_takes_tritons_booleans(value: str, enabled: bool) -> None:
    config = parse_backend_config([f"onnxruntime,enable-global-threadpool={value}"])
    assert config.onnxruntime.enable_global_threadpool is enabled


def test_default_max_batch_size_for_every_backend_and_overridden_by_onnxruntimes() -> None:
    """Triton core gives the setting with no backend named to every backend; a backend's own wins
    whatever the order (``TritonModel::ResolveBackendConfigs``)."""
    every = parse_backend_config(["default-max-batch-size=8"])
    assert every.default_max_batch_size_of("onnxruntime") == every.default_max_batch_size_of("mine") == 8
    both = parse_backend_config(["onnxruntime,default-max-batch-size=2", "default-max-batch-size=8"])
    assert (both.default_max_batch_size_of("onnxruntime"), both.default_max_batch_size_of("mine")) == (2, 8)
    assert parse_backend_config(["default-max-batch-size=0"]).default_max_batch_size_of("onnxruntime") == 0


def test_the_last_of_a_setting_wins() -> None:
    config = parse_backend_config(["onnxruntime,intra_op_thread_count=3", "onnxruntime,intra_op_thread_count=5"])
    assert config.onnxruntime.intra_op_thread_count == 5


@pytest.mark.parametrize(("value", "text"), [
    ("onnxruntime,enable-mem-arena=1", "onnxruntime setting 'enable-mem-arena' is not supported (supported: "
                                       "enable-global-threadpool, intra_op_thread_count, inter_op_thread_count, "
                                       "default-max-batch-size)"),
    ("thread-count=4", "setting 'thread-count' (no backend named: every backend's) is not supported (supported: "
                       "default-max-batch-size)"),
    (",default-max-batch-size=4", "No backend specified. --backend-config option format is <backend name>,<setting>="
                                  "<value> or <setting>=<value>. Got ,default-max-batch-size=4"),
    ("onnxruntime,enable-global-threadpool=maybe", "onnxruntime setting 'enable-global-threadpool' must be a boolean "
                                                   "(true, on, 1, false, off, 0), got 'maybe'"),
    ("onnxruntime,intra_op_thread_count=four", "onnxruntime setting 'intra_op_thread_count' must be an integer >= 0, "
                                               "got 'four'"),
    ("onnxruntime,inter_op_thread_count=-1", "onnxruntime setting 'inter_op_thread_count' must be an integer >= 0, "
                                             "got '-1'"),
    ("onnxruntime,default-max-batch-size=", "onnxruntime setting 'default-max-batch-size' must be an integer >= 0, "
                                            "got ''"),
    ("default-max-batch-size=-2", "setting 'default-max-batch-size' must be an integer >= 0, got '-2'"),
])
def test_what_is_refused(value: str, text: str) -> None:
    with pytest.raises(ValueError) as raised:
        parse_backend_config([value])
    assert text in str(raised.value)


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """ONNX Runtime's global pools as this process has none, and the sizes ``initialize`` makes them
    with (recorded, never made: once made, every later session of the test process would need them)."""
    calls: list[tuple[int, int]] = []
    onnx._warn_once.cache_clear()
    monkeypatch.setattr(onnx, "_global_pools", None)
    monkeypatch.setattr(onnx.ort, "set_global_thread_pool_sizes", lambda intra, inter: calls.append((intra, inter)))
    return calls


def test_the_global_pools_are_made_once_with_the_sizes_given(made: list[tuple[int, int]],
                                                              caplog: pytest.LogCaptureFixture) -> None:
    settings = OnnxRuntimeBackendConfig(enable_global_threadpool=True, intra_op_thread_count=3, inter_op_thread_count=2)
    with caplog.at_level(logging.INFO, logger=onnx.log.name):
        onnx.initialize(settings)
        onnx.initialize(settings)  # the next model's load
    assert made == [(3, 2)]
    assert "global thread pools: 3 intra-op and 2 inter-op threads" in caplog.text
    with pytest.raises(ValueError, match="have 3 intra-op and 2 inter-op threads; they cannot be replaced with 4 and 2"):
        onnx.initialize(OnnxRuntimeBackendConfig(True, 4, 2))


def test_without_the_global_pools_none_are_made_and_the_counts_warn(made: list[tuple[int, int]],
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    onnx.initialize(OnnxRuntimeBackendConfig())
    assert not caplog.text
    onnx.initialize(OnnxRuntimeBackendConfig(intra_op_thread_count=3))
    assert made == []
    assert "have no effect without enable-global-threadpool=1" in caplog.text


def test_an_onnx_runtime_without_global_pools_is_refused(made: list[tuple[int, int]],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(onnx.ort, "set_global_thread_pool_sizes")
    with pytest.raises(ValueError, match="cannot make \\(onnxruntime.set_global_thread_pool_sizes\\)"):
        onnx.initialize(OnnxRuntimeBackendConfig(enable_global_threadpool=True))


def test_sessions_run_on_the_global_pools_once_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """ONNX Runtime's own session options, read back: a model's thread counts set its session's
    pools; with the global pools, the session has none of its own and the counts are not read."""
    parameters = {"intra_op_thread_count": "3", "inter_op_thread_count": "2"}
    monkeypatch.setattr(onnx, "_global_pools", None)
    own = onnx.session_options(parameters, 0)
    assert (own.use_per_session_threads, own.intra_op_num_threads, own.inter_op_num_threads) == (True, 3, 2)
    monkeypatch.setattr(onnx, "_global_pools", (4, 1))
    shared = onnx.session_options(parameters, 0)
    assert (shared.use_per_session_threads, shared.intra_op_num_threads, shared.inter_op_num_threads) == (False, 0, 0)
