"""``--backend-config`` for the onnxruntime backend, as a Triton 2.51 deployment passes it: the global
thread pools (``enable-global-threadpool`` with ``intra_op_thread_count`` / ``inter_op_thread_count``)
and ``default-max-batch-size`` (for every backend, or the onnxruntime backend's own) act on a real
server; other settings and bad values are usage errors naming them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto

from helpers import add_model, client_for, http_json, identity_model, infer_input, start_server

GLOBAL_POOLS = ("--backend-config=onnxruntime,enable-global-threadpool=1",
                "--backend-config=onnxruntime,intra_op_thread_count=2",
                "--backend-config=onnxruntime,inter_op_thread_count=1")


def _repository(tmp_path: Path) -> Path:
    """``plain``: no config.pbtxt, every dim dynamic (auto-complete batches it); ``tuned``: its own
    thread count parameter."""
    models = tmp_path / "models"
    add_model(models, "plain", identity_model(TensorProto.FLOAT))
    add_model(models, "tuned", identity_model(TensorProto.FLOAT, [-1, 3]),
              'max_batch_size: 4\nparameters { key: "intra_op_thread_count" value { string_value: "3" } }\n')
    return models


def test_the_global_pools_and_the_onnxruntime_default_max_batch_size_act(tmp_path: Path) -> None:
    """The backend's own default-max-batch-size wins over the one for every backend; the sessions
    run on the global pools (a session with pools of its own cannot open once they exist in the
    process, so a model that loads and infers proves it), and a model's thread count is said to have
    no effect."""
    server = start_server(_repository(tmp_path), tmp_path / "logs", *GLOBAL_POOLS,
                          "--backend-config=default-max-batch-size=2",
                          "--backend-config=onnxruntime,default-max-batch-size=8")
    try:
        status, config = http_json(server, "/v2/models/plain/config")
        assert status == 200, config
        assert config["max_batch_size"] == 8
        assert "dynamic_batching" in config
        rows = np.arange(24, dtype=np.float32).reshape(8, 3)
        with client_for(httpclient, server) as client:
            for model in ("plain", "tuned"):
                result = client.infer(model, [infer_input(httpclient, "INPUT0", rows[:4], "FP32")])
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), rows[:4])
            full = client.infer("plain", [infer_input(httpclient, "INPUT0", rows, "FP32")])
            np.testing.assert_array_equal(full.as_numpy("OUTPUT0"), rows)
        log = server.log_path.read_text()
        assert "every session runs on ONNX Runtime's global thread pools: 2 intra-op and 1 inter-op threads" in log
        assert "model 'tuned': parameters ['intra_op_thread_count'] have no effect" in log
    finally:
        server.stop()


def test_default_max_batch_size_for_every_backend_and_thread_counts_without_the_pools(tmp_path: Path) -> None:
    server = start_server(_repository(tmp_path), tmp_path / "logs", "--backend-config=default-max-batch-size=2",
                          "--backend-config=onnxruntime,intra_op_thread_count=2")
    try:
        status, config = http_json(server, "/v2/models/plain/config")
        assert status == 200, config
        assert config["max_batch_size"] == 2
        log = server.log_path.read_text()
        assert "global thread pools:" not in log
        assert log.count("have no effect without enable-global-threadpool=1") == 1  # once, not per model
    finally:
        server.stop()


@pytest.mark.parametrize(("flag", "text"), [
    ("onnxruntime,enable-mem-arena=1", "onnxruntime setting 'enable-mem-arena' is not supported (supported: "
                                       "enable-global-threadpool, intra_op_thread_count, inter_op_thread_count, "
                                       "default-max-batch-size)"),
    ("onnxruntime,enable-global-threadpool=maybe", "onnxruntime setting 'enable-global-threadpool' must be a boolean"),
    ("onnxruntime,intra_op_thread_count=many", "onnxruntime setting 'intra_op_thread_count' must be an integer >= 0, "
                                               "got 'many'"),
    ("default-max-batch-size=-1", "setting 'default-max-batch-size' must be an integer >= 0, got '-1'"),
])
def test_what_is_refused(tmp_path: Path, flag: str, text: str) -> None:
    (tmp_path / "models").mkdir()
    with pytest.raises(RuntimeError) as raised:
        start_server(tmp_path / "models", tmp_path / "logs", "--backend-config", flag)
    assert "server exited with 2" in str(raised.value)  # a usage error
    assert text in str(raised.value)
