"""config.pbtxt fields the server does not act on: a refused one fails the load naming it, a warned one
loads and is logged once (kserve_v2/repository/config_fields.py)."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from helpers import add_model, identity_model, start_server

CONFIG = 'max_batch_size: 4\ninput [{ name: "INPUT0" data_type: TYPE_FP32 dims: [4] }]\n'


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("repo")
    model = identity_model(TensorProto.FLOAT, [None, 4])
    add_model(repository, "refused", model, CONFIG + 'model_operations { op_library_filename: "libcustom.so" }\n')
    add_model(repository, "warned", model, CONFIG + 'optimization { cuda { graphs: true } }\n'
              'cc_model_filenames { key: "8.0" value: "model.onnx" }\n')
    started = start_server(repository, tmp_path_factory.mktemp("logs"), "--model-control-mode", "explicit",
                           "--load-model", "*", "--exit-on-error=false")
    yield started
    assert started.stop() == 0


def test_a_refused_field_fails_the_load_naming_it(server) -> None:
    with grpcclient.InferenceServerClient(server.url) as client:
        assert not client.is_model_ready("refused")
        reasons = {m.name: m.reason for m in client.get_model_repository_index().models}
        assert "config field 'model_operations' is not supported by this server" in reasons["refused"]
        with pytest.raises(InferenceServerException) as err:
            client.load_model("refused")
        assert "config field 'model_operations' is not supported by this server" in err.value.message()


def test_a_warned_field_loads_and_is_logged_once(server) -> None:
    with grpcclient.InferenceServerClient(server.url) as client:
        assert client.is_model_ready("warned")
        tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        assert client.infer("warned", [tensor]).as_numpy("OUTPUT0").tolist() == [[1.0] * 4]
    log = server.log()
    assert log.count("model 'warned': config field 'optimization.cuda' has no effect on this server") == 1
    assert log.count("model 'warned': config field 'cc_model_filenames' has no effect on this server") == 1
