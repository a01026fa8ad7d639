"""``EXECUTION_ENV_PATH`` (Triton's python_backend README, "Using Custom Execution Environments"): a python
model whose instances run in stub processes with a packed environment's own interpreter and packages.

conda-pack cannot be installed here (it packs conda environments, and there is no conda), so the archive is a
tar.gz of a virtual environment: the same layout (``bin/activate``, ``bin/python3``, ``lib/python3.X/site-packages``)
that Triton unpacks and activates.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from helpers import add_python_model, start_server

CONFIG = '''
max_batch_size: 0
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "INFO" data_type: TYPE_STRING dims: [ 1 ] }]
parameters: { key: "EXECUTION_ENV_PATH" value: { string_value: "PATH_HERE" } }
'''
MODEL = '''
    import json
    import os
    import sys

    import envonly
    import msgpack
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                info = json.dumps({"prefix": sys.prefix, "msgpack": msgpack.__version__, "envonly": envonly.VALUE,
                                   "pid": os.getpid()})
                responses.append(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("OUTPUT0", (a * 2).astype(np.float32)),
                    pb_utils.Tensor("INFO", np.array([info.encode()], dtype=np.object_))]))
            return responses
'''


def packed_environment(folder: Path) -> Path:
    """A virtual environment of this Python with its own ``envonly`` module and its own ``msgpack`` (which the
    server has too: the environment's must win), packed as ``python_env.tar.gz``."""
    env = folder / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    purelib = sysconfig.get_path("purelib", vars={"base": str(env), "platbase": str(env)})
    (Path(purelib) / "envonly.py").write_text("VALUE = 42\n")
    (Path(purelib) / "msgpack").mkdir()
    (Path(purelib) / "msgpack" / "__init__.py").write_text('__version__ = "from the environment"\n')
    archive = folder / "python_env.tar.gz"
    with tarfile.open(archive, "w:gz") as packed:
        packed.add(env, arcname=".")
    return archive


def test_a_model_runs_in_its_packed_environment(tmp_path: Path) -> None:
    repository = tmp_path / "models"
    folder = add_python_model(repository, "in_env", CONFIG.replace("PATH_HERE", "$$TRITON_MODEL_DIRECTORY/python_env.tar.gz"),
                              MODEL)
    packed_environment(tmp_path)
    (tmp_path / "python_env.tar.gz").rename(folder / "python_env.tar.gz")
    add_python_model(repository, "missing_env", CONFIG.replace("PATH_HERE", "/no/such/env.tar.gz"), MODEL)
    add_python_model(repository, "env_in_process", CONFIG.replace("PATH_HERE", "$$TRITON_MODEL_DIRECTORY/x")
                     + 'parameters: { key: "EXECUTION_MODE" value: { string_value: "in_process" } }\n', MODEL)
    server = start_server(repository, tmp_path / "logs", "--exit-on-error=false")
    try:
        with grpcclient.InferenceServerClient(server.url) as client:
            tensor = grpcclient.InferInput("INPUT0", [2], "FP32")
            tensor.set_data_from_numpy(np.array([1.5, -2.0], np.float32))
            result = client.infer("in_env", [tensor])
            assert result.as_numpy("OUTPUT0").tolist() == [3.0, -4.0]
            info = json.loads(result.as_numpy("INFO")[0])
            unpacked = Path(info["prefix"])
            assert unpacked.parent.name.startswith("kserve_v2_python_env_"), info  # the archive, unpacked
            assert Path(tempfile.gettempdir()) in unpacked.parents
            assert info["msgpack"] == "from the environment" and info["envonly"] == 42
            assert info["pid"] != server.proc.pid
            for name, reason in (("missing_env", "Failed to get the canonical path for /no/such/env.tar.gz."),
                                 ("env_in_process", "EXECUTION_ENV_PATH")):
                assert not client.is_model_ready(name)
                with pytest.raises(InferenceServerException):
                    client.infer(name, [tensor])
                assert reason in server.log()
    finally:
        assert server.stop() == 0
    assert not unpacked.exists()  # removed at exit
    assert os.path.exists(folder / "python_env.tar.gz")
