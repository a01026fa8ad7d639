"""Model repositories in object storage (``--model-repository s3://...`` / ``gs://...`` / ``as://...``), read as
Triton reads them, against real storage APIs started here: moto's standalone S3 server, gcp-storage-emulator and
Azurite (Microsoft's Azure Storage emulator, installed by ``make azurite`` under ``.venv/azurite``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import boto3
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from deploy.s3_store import answers
from helpers import free_port, http_json, make_model, start_server, wait_until

ROOT = Path(__file__).resolve().parents[2]
KEY_ID = "AKIAKSERVEV2TEST0001"
SECRET = "kserve-v2-secret-never-logged-0123456789"


def scale_model(factor: float) -> bytes:
    """OUTPUT0 = INPUT0 * factor on FP32 [batch, 4]: tells versions apart."""
    const = helper.make_node("Constant", [], ["k"], value=helper.make_tensor("k", TensorProto.FLOAT, [], [factor]))
    return make_model([const, helper.make_node("Mul", ["INPUT0", "k"], ["OUTPUT0"])],
                      [("INPUT0", TensorProto.FLOAT, [None, 4])],
                      [("OUTPUT0", TensorProto.FLOAT, [None, 4])]).SerializeToString()


def infer(client: grpcclient.InferenceServerClient, model: str) -> float:
    tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    return float(client.infer(model, [tensor]).as_numpy("OUTPUT0")[0, 0])


class Moto:
    """moto's standalone S3 server in a subprocess on a free port (the S3 REST API, as MinIO serves it)."""

    def __init__(self, tmp: Path, port: int = 0) -> None:
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = open(tmp / f"moto-{self.port}-{time.monotonic_ns()}.log", "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        wait_until(lambda: answers(self.endpoint), "moto server up", timeout=30)
        self.s3 = boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=KEY_ID,
                               aws_secret_access_key=SECRET, region_name="us-east-1")

    def url(self, bucket: str = "models", path: str = "repo") -> str:
        return f"s3://127.0.0.1:{self.port}/{bucket}/{path}"

    def put(self, key: str, data: bytes | str, bucket: str = "models") -> None:
        self.s3.put_object(Bucket=bucket, Key=key, Body=data.encode() if isinstance(data, str) else data)

    def delete_prefix(self, prefix: str, bucket: str = "models") -> None:
        for item in self.s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", []):
            self.s3.delete_object(Bucket=bucket, Key=item["Key"])

    def reset(self) -> None:
        """Forget every bucket (moto's ``/moto-api/reset``)."""
        urllib.request.urlopen(urllib.request.Request(self.endpoint + "/moto-api/reset", method="POST")).close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        self.log.close()


CREDENTIALS = {"AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"}


@pytest.fixture
def moto(tmp_path: Path) -> Iterator[Moto]:
    server = Moto(tmp_path)
    server.s3.create_bucket(Bucket="models")
    server.put("repo/scale/1/model.onnx", scale_model(2.0))
    server.put("repo/scale/config.pbtxt", 'name: "scale"\nbackend: "onnxruntime"\nmax_batch_size: 8\n')
    server.put("repo/other/1/model.onnx", scale_model(3.0))
    yield server
    server.stop()


def mount(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    folder = tmp_path / "mount"
    folder.mkdir()
    return folder, {**CREDENTIALS, "TRITON_AWS_MOUNT_DIRECTORY": str(folder)}


def test_s3_poll_load_infer_new_version_removed_model(moto: Moto, tmp_path: Path) -> None:
    folder, env = mount(tmp_path)
    server = start_server(moto.url(), tmp_path / "logs", "--model-control-mode", "poll", "--repository-poll-secs", "1",
                          env=env)
    try:
        with grpcclient.InferenceServerClient(server.url) as client:
            assert client.is_server_ready()
            assert infer(client, "scale") == 2.0 and infer(client, "other") == 3.0
            assert client.get_model_config("scale").config.max_batch_size == 8  # config.pbtxt from the bucket
            copies = list(folder.glob("*/scale/1/model.onnx"))
            assert len(copies) == 1 and not list(folder.glob("*/.staging-*"))  # renamed into place
            other_copy = next(folder.glob("*/other/1/model.onnx"))
            inode = other_copy.stat().st_ino

            moto.put("repo/scale/2/model.onnx", scale_model(4.0))  # a new version: latest 1 serves it
            wait_until(lambda: client.is_model_ready("scale", "2"), "version 2 READY")
            assert infer(client, "scale") == 4.0
            assert not client.is_model_ready("scale", "1")
            assert other_copy.stat().st_ino == inode  # an unchanged model is not downloaded again

            moto.put("repo/scale/config.pbtxt", 'name: "scale"\nbackend: "onnxruntime"\nmax_batch_size: 4\n')
            wait_until(lambda: client.get_model_config("scale").config.max_batch_size == 4, "changed config loaded")

            moto.delete_prefix("repo/other/")  # a removed model is unloaded
            wait_until(lambda: not client.is_model_ready("other"), "'other' unloaded")
            # the poll unloads, then forgets the model: the index drops it once both are done
            wait_until(lambda: {m.name for m in client.get_model_repository_index().models} == {"scale"},
                       "'other' gone from the index")
        assert SECRET not in server.log()
    finally:
        assert server.stop() == 0
    assert not list(folder.glob("*/.staging-*"))


def test_s3_explicit_index_load_unload(moto: Moto, tmp_path: Path) -> None:
    folder, env = mount(tmp_path)
    server = start_server(moto.url(), tmp_path / "logs", "--model-control-mode", "explicit", env=env)
    try:
        with grpcclient.InferenceServerClient(server.url) as client:
            index = {m.name: m.state for m in client.get_model_repository_index().models}
            assert index == {"scale": "", "other": ""}  # listed from the bucket
            assert not list(folder.glob("*/scale"))  # ... without downloading anything
            client.load_model("scale")
            assert client.is_model_ready("scale") and infer(client, "scale") == 2.0
            moto.put("repo/late/1/model.onnx", scale_model(5.0))  # added after start: an explicit load finds it
            client.load_model("late")
            assert infer(client, "late") == 5.0
            override = json.dumps({"backend": "onnxruntime", "max_batch_size": 2})  # a config override, as locally
            client.load_model("scale", config=override)
            assert client.get_model_config("scale").config.max_batch_size == 2 and infer(client, "scale") == 2.0
            client.unload_model("scale")
            wait_until(lambda: not client.is_model_ready("scale"), "'scale' unloaded")
            with pytest.raises(InferenceServerException, match="failed to poll from model repository"):
                client.load_model("missing")
    finally:
        assert server.stop() == 0


def test_s3_missing_bucket_fails_naming_the_url_without_the_secret(moto: Moto, tmp_path: Path) -> None:
    wrong = "wrong-secret-must-not-appear-987654321"
    env = {**CREDENTIALS, "AWS_SECRET_ACCESS_KEY": wrong}
    with pytest.raises(RuntimeError) as failed:  # no bucket: moto answers NoSuchBucket
        start_server(moto.url(bucket="absent"), tmp_path / "logs", env=env)
    text = str(failed.value)
    assert "exited with 1" in text and f"model repository '{moto.url(bucket='absent')}' cannot be read" in text
    assert "bucket does not exist" in text and wrong not in text and SECRET not in text
    # --exit-on-error=false: the server stays up, not live, with the reason in its log
    server = start_server(moto.url(bucket="absent"), tmp_path / "logs", "--exit-on-error=false", env=env,
                          wait_startup=False)
    try:
        wait_until(lambda: "server failed to initialize" in server.log(), "the failure logged")
        with grpcclient.InferenceServerClient(server.url) as client:
            assert not client.is_server_live()
        assert moto.url(bucket="absent") in server.log() and wrong not in server.log()
    finally:
        server.stop()


def test_s3_refused_credentials_fail_clearly(tmp_path: Path) -> None:
    """moto checks signatures once authentication is on (INITIAL_NO_AUTH_ACTION_COUNT): a wrong secret is refused."""
    port = free_port()
    log = open(tmp_path / "moto.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], stdout=log,
                            stderr=subprocess.STDOUT, env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "4"})
    try:
        endpoint = f"http://127.0.0.1:{port}"
        wait_until(lambda: _open(endpoint + "/moto-api/"), "moto server up", timeout=30)
        iam = boto3.client("iam", endpoint_url=endpoint, aws_access_key_id="x", aws_secret_access_key="y",
                           region_name="us-east-1")
        iam.create_user(UserName="reader")
        policy = iam.create_policy(PolicyName="all", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
        iam.attach_user_policy(UserName="reader", PolicyArn=policy["Policy"]["Arn"])
        key = iam.create_access_key(UserName="reader")["AccessKey"]
        s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=key["AccessKeyId"],
                          aws_secret_access_key=key["SecretAccessKey"], region_name="us-east-1")
        s3.create_bucket(Bucket="models")
        s3.put_object(Bucket="models", Key="repo/scale/1/model.onnx", Body=scale_model(2.0))
        url = f"s3://127.0.0.1:{port}/models/repo"
        wrong = "wrong-secret-must-not-appear-987654321"
        env = {**CREDENTIALS, "AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": wrong}
        with pytest.raises(RuntimeError) as failed:
            start_server(url, tmp_path / "logs", env=env)
        text = str(failed.value)
        assert f"model repository '{url}' cannot be read" in text and "signature" in text and wrong not in text
        good = {**env, "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}
        server = start_server(url, tmp_path / "logs", env=good)  # no mount folder: a temporary one
        try:
            with grpcclient.InferenceServerClient(server.url) as client:
                assert infer(client, "scale") == 2.0
            assert key["SecretAccessKey"] not in server.log()
            copies = list(Path(tempfile.gettempdir()).glob(f"kserve_v2-{server.proc.pid}-s3-*/scale/1/model.onnx"))
            assert len(copies) == 1
        finally:
            assert server.stop() == 0
        assert not copies[0].parents[2].exists()  # removed at exit
        # TRITON_CLOUD_CREDENTIAL_PATH: the longest matching prefix's keys; the environment's wrong secret is not read
        creds = tmp_path / "creds.json"
        creds.write_text(json.dumps({"s3": {
            "": {"key_id": key["AccessKeyId"], "secret_key": wrong},
            f"s3://127.0.0.1:{port}/models": {"key_id": key["AccessKeyId"], "secret_key": key["SecretAccessKey"],
                                              "region": "us-east-1"}}}))
        server = start_server(url, tmp_path / "logs", env={**env, "TRITON_CLOUD_CREDENTIAL_PATH": str(creds)})
        try:
            with grpcclient.InferenceServerClient(server.url) as client:
                assert infer(client, "scale") == 2.0
        finally:
            assert server.stop() == 0
        creds.write_text(json.dumps({"s3": {"s3://elsewhere": {"key_id": "a", "secret_key": "b"}}}))
        with pytest.raises(RuntimeError, match=f"Cannot match credential for path {url}"):
            start_server(url, tmp_path / "logs", env={**good, "TRITON_CLOUD_CREDENTIAL_PATH": str(creds)})
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def _open(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=1).close()
        return True
    except OSError:
        return False


def test_s3_endpoint_dies_during_poll_keeps_serving(moto: Moto, tmp_path: Path) -> None:
    _, env = mount(tmp_path)
    server = start_server(moto.url(), tmp_path / "logs", "--model-control-mode", "poll", "--repository-poll-secs", "1",
                          env=env)
    try:
        with grpcclient.InferenceServerClient(server.url) as client:
            assert infer(client, "scale") == 2.0
            moto.stop()
            wait_until(lambda: "keeping the last listing" in server.log(), "a failed poll logged", timeout=60)
            assert infer(client, "scale") == 2.0 and client.is_server_ready()
            assert moto.url() in server.log()
            # the endpoint comes back (empty: moto keeps nothing): the next poll follows it again
            back = Moto(tmp_path, moto.port)
            back.s3.create_bucket(Bucket="models")
            back.put("repo/scale/1/model.onnx", scale_model(6.0))
            back.put("repo/scale/config.pbtxt", 'name: "scale"\nbackend: "onnxruntime"\nmax_batch_size: 8\n')
            try:
                wait_until(lambda: infer(client, "scale") == 6.0, "changed model reloaded after the outage", timeout=60)
                assert not client.is_model_ready("other")
            finally:
                back.stop()
    finally:
        assert server.stop() == 0


def _names(client: grpcclient.InferenceServerClient) -> set[str]:
    return {m.name for m in client.get_model_repository_index().models}


def test_s3_poll_missing_bucket_keeps_serving_and_an_empty_prefix_unloads_every_model(moto: Moto,
                                                                                      tmp_path: Path) -> None:
    """A bucket that goes away is an outage (the last listing serves on); a prefix with no object in a bucket that
    exists is an empty repository: the poll unloads the last models, as Triton's does."""
    _, env = mount(tmp_path)
    server = start_server(moto.url(), tmp_path / "logs", "--model-control-mode", "poll", "--repository-poll-secs", "1",
                          env=env)
    try:
        with grpcclient.InferenceServerClient(server.url) as client:
            assert infer(client, "scale") == 2.0 and client.is_server_ready()
            moto.reset()  # every bucket gone
            wait_until(lambda: "bucket does not exist; keeping the last listing" in server.log(), "a failed poll logged")
            assert f"model repository '{moto.url()}' cannot be read" in server.log()
            assert infer(client, "scale") == 2.0 and _names(client) == {"scale", "other"}
            moto.s3.create_bucket(Bucket="models")  # back, with nothing under repo/: every model goes
            wait_until(lambda: not client.is_model_ready("scale") and not client.is_model_ready("other"),
                       "every model unloaded")
            wait_until(lambda: _names(client) == set(), "the index empty")  # unloaded, then forgotten
            # live; ready as with a local repository emptied in poll mode (test_lifecycle's empty repository)
            assert client.is_server_live() and not client.is_server_ready()
            moto.put("repo/scale/1/model.onnx", scale_model(5.0))  # and a model that comes back loads again
            wait_until(lambda: client.is_model_ready("scale"), "'scale' loaded again")
            assert infer(client, "scale") == 5.0 and client.is_server_live()
        assert SECRET not in server.log()
    finally:
        assert server.stop() == 0


def test_s3_empty_prefix_at_start_is_no_repository(moto: Moto, tmp_path: Path) -> None:
    """As Triton's IsDirectory: a path in a bucket that holds no object is not a valid directory at start; a URL that
    names a bucket alone is a repository, empty or not."""
    with pytest.raises(RuntimeError) as failed:
        start_server(moto.url(path="nothing"), tmp_path / "logs", env=CREDENTIALS)
    assert (f"model repository '{moto.url(path='nothing')}' cannot be read: no object under 'nothing/' in 'models': "
            "repository path is not a valid directory") in str(failed.value)
    moto.s3.create_bucket(Bucket="empty")
    server = start_server(f"s3://127.0.0.1:{moto.port}/empty", tmp_path / "logs", "--model-control-mode", "explicit",
                          env=CREDENTIALS)
    try:
        with grpcclient.InferenceServerClient(server.url) as client:
            assert client.is_server_ready() and _names(client) == set()
    finally:
        assert server.stop() == 0


def test_s3_load_from_a_missing_bucket_names_the_url_without_a_secret(moto: Moto, tmp_path: Path) -> None:
    url = moto.url()
    _, env = mount(tmp_path)
    server = start_server(url, tmp_path / "logs", "--model-control-mode", "explicit", env=env)
    try:
        with grpcclient.InferenceServerClient(server.url) as client:
            client.load_model("other")
            moto.reset()  # every bucket gone
            # listed before (its files are read now) and never listed (the listing failed): both name the URL
            for name in ("scale", "late"):
                with pytest.raises(InferenceServerException) as failed:
                    client.load_model(name)
                text = failed.value.message()
                assert text.startswith(f"failed to load '{name}', failed to poll from model repository '{url}': ")
                assert "bucket does not exist" in text and SECRET not in text and KEY_ID not in text
                assert f"failed to load '{name}', failed to poll from model repository '{url}'" in server.log()
            assert infer(client, "other") == 3.0  # what was loaded serves on
        status, body = http_json(server, "/v2/repository/models/scale/load", {})
        assert status == 500 and body["error"].startswith(
            f"failed to load 'scale', failed to poll from model repository '{url}': "), body
        assert SECRET not in body["error"]
        assert SECRET not in server.log()
    finally:
        assert server.stop() == 0
    # a start that failed (--exit-on-error=false): a load names the repository that failed, as the start did
    absent = moto.url(bucket="absent")
    server = start_server(absent, tmp_path / "logs", "--model-control-mode", "explicit", "--exit-on-error=false",
                          env=CREDENTIALS, wait_startup=False)
    try:
        wait_until(lambda: "server failed to initialize" in server.log(), "the failure logged")
        with grpcclient.InferenceServerClient(server.url) as client:
            with pytest.raises(InferenceServerException) as failed:
                client.load_model("scale")
        text = failed.value.message()
        assert text.startswith(f"failed to load 'scale', failed to poll from model repository '{absent}': ")
        assert "bucket does not exist" in text and SECRET not in text and SECRET not in server.log()
    finally:
        server.stop()


@pytest.mark.parametrize("state", ["missing", "not empty"])
def test_mount_directory_must_exist_and_be_empty(state: str, tmp_path: Path) -> None:
    folder = tmp_path / "mount"
    if state == "not empty":
        folder.mkdir()
        (folder / "left-over").write_text("x")
    result = subprocess.run([sys.executable, "-m", "kserve_v2", "serve", "--model-repository", "s3://127.0.0.1:9/b/r"],
                            capture_output=True, text=True, cwd=ROOT, timeout=60,
                            env={**os.environ, "TRITON_AWS_MOUNT_DIRECTORY": str(folder)})
    assert result.returncode == 2
    expected = "an existing folder" if state == "missing" else "an empty folder"
    assert f"TRITON_AWS_MOUNT_DIRECTORY '{folder}' must name {expected}" in result.stderr


def test_missing_extra_is_named(tmp_path: Path) -> None:
    """adlfs is a test dependency: the server runs with it made unimportable (sys.modules entry None), as if absent."""
    hide = ("import runpy, sys; sys.modules['adlfs'] = None; "
            "sys.argv = ['kserve_v2', 'serve', '--model-repository', 'as://acct/models/repo']; "
            "runpy.run_module('kserve_v2', run_name='__main__', alter_sys=True)")
    result = subprocess.run([sys.executable, "-c", hide], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.returncode == 2
    assert "as:// model repositories need the 'adlfs' package: pip install kserve_v2[azure]" in result.stderr


def test_unknown_url_form_is_a_usage_error(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "kserve_v2", "serve", "--model-repository", "s3://"],
                            capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.returncode == 2 and "model repository 's3://' names no bucket" in result.stderr


class GcsEmulator:
    """gcp-storage-emulator (the GCS JSON API, in memory) in a subprocess on a free port."""

    def __init__(self, tmp: Path) -> None:
        import gcsfs  # after the variables below: gcsfs reads GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT on import

        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = open(tmp / "gcs-emulator.log", "w")
        self.proc = subprocess.Popen([sys.executable, "-c", "from gcp_storage_emulator.__main__ import main; main()",
                                      "start", "--host", "127.0.0.1", "--port", str(self.port), "--in-memory"],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        wait_until(lambda: _open(self.endpoint + "/storage/v1/b"), "GCS emulator up", timeout=30)
        self.fs = gcsfs.GCSFileSystem(token="anon", endpoint_url=self.endpoint, skip_instance_cache=True,
                                      use_listings_cache=False)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        self.log.close()


@pytest.fixture
def gcs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[GcsEmulator]:
    monkeypatch.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    emulator = GcsEmulator(tmp_path)
    emulator.fs.mkdir("models")
    emulator.fs.pipe("models/repo/scale/1/model.onnx", scale_model(2.0))
    emulator.fs.pipe("models/repo/other/1/model.onnx", scale_model(3.0))
    yield emulator
    emulator.stop()


def test_gcs_poll_and_explicit(gcs: GcsEmulator, tmp_path: Path) -> None:
    folder = tmp_path / "mount"
    folder.mkdir()
    env = {"STORAGE_EMULATOR_HOST": gcs.endpoint, "TRITON_GCS_MOUNT_DIRECTORY": str(folder)}
    server = start_server("gs://models/repo", tmp_path / "logs", "--model-control-mode", "poll",
                          "--repository-poll-secs", "1", env=env)
    try:
        with grpcclient.InferenceServerClient(server.url) as client:
            assert infer(client, "scale") == 2.0 and infer(client, "other") == 3.0
            assert len(list(folder.glob("*/scale/1/model.onnx"))) == 1
            gcs.fs.pipe("models/repo/scale/2/model.onnx", scale_model(4.0))
            wait_until(lambda: client.is_model_ready("scale", "2"), "version 2 READY")
            assert infer(client, "scale") == 4.0
            gcs.fs.rm("models/repo/other", recursive=True)
            wait_until(lambda: not client.is_model_ready("other"), "'other' unloaded")
    finally:
        assert server.stop() == 0
    folder = tmp_path / "mount2"
    folder.mkdir()
    env["TRITON_GCS_MOUNT_DIRECTORY"] = str(folder)
    server = start_server("gs://models/repo", tmp_path / "logs", "--model-control-mode", "explicit",
                          env=env)
    try:
        with grpcclient.InferenceServerClient(server.url) as client:
            assert {m.name for m in client.get_model_repository_index().models} == {"scale"}
            assert not list(folder.glob("*/scale"))
            client.load_model("scale")
            assert infer(client, "scale") == 4.0
            client.unload_model("scale")
            wait_until(lambda: not client.is_model_ready("scale"), "'scale' unloaded")
    finally:
        assert server.stop() == 0


def _peak_rss(pid: int) -> int:
    """VmHWM of a process (bytes): its peak resident set size since it started."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.mark.slow
def test_s3_large_file_streams_to_disk(moto: Moto, tmp_path: Path) -> None:
    size = 200 * 2**20
    blob = tmp_path / "weights.bin"
    with open(blob, "wb") as f:
        for _ in range(size // 2**20):
            f.write(os.urandom(2**20))
    moto.put("repo/big/1/model.onnx", scale_model(7.0))
    moto.s3.upload_file(str(blob), "models", "repo/big/1/weights.bin")
    blob.unlink()
    folder, env = mount(tmp_path)
    server = start_server(moto.url(), tmp_path / "logs", "--model-control-mode", "explicit", env=env)
    try:
        with grpcclient.InferenceServerClient(server.url) as client:
            client.load_model("scale")  # ONNX Runtime's own start-up memory, before the measure
            before = _peak_rss(server.proc.pid)
            client.load_model("big")
            assert infer(client, "big") == 7.0
            growth = _peak_rss(server.proc.pid) - before
            assert next(folder.glob("*/big/1/weights.bin")).stat().st_size == size
            assert growth < 64 * 2**20, f"peak RSS grew by {growth / 2**20:.1f} MiB while downloading 200 MiB"
    finally:
        assert server.stop() == 0


# Azurite's well-known development account and key (published in Azurite's README; not a secret)
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
AZURITE_BIN = ROOT / ".venv" / "azurite" / "node_modules" / ".bin" / "azurite-blob"


class Azurite:
    """Azurite's Blob service in a subprocess on a free port, keeping its blobs under ``tmp``."""

    def __init__(self, tmp: Path) -> None:
        import adlfs

        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}/{AZURITE_ACCOUNT}"
        self.log = open(tmp / "azurite.log", "w")
        (tmp / "azurite").mkdir()
        self.proc = subprocess.Popen([str(AZURITE_BIN), "--blobHost", "127.0.0.1", "--blobPort", str(self.port),
                                      "--location", str(tmp / "azurite"), "--silent", "--skipApiVersionCheck",
                                      "--loose", "--disableTelemetry"], stdout=self.log, stderr=subprocess.STDOUT)
        wait_until(lambda: self._up(), "Azurite up", timeout=60)
        self.fs = adlfs.AzureBlobFileSystem(connection_string=self.connection_string(AZURITE_KEY),
                                            skip_instance_cache=True, use_listings_cache=False)

    def _up(self) -> bool:
        try:
            urllib.request.urlopen(self.endpoint + "?comp=list", timeout=1).close()
        except urllib.error.HTTPError:
            return True  # an unsigned request is refused: the service answers
        except OSError:
            return False
        return True

    def connection_string(self, key: str) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={key};"
                f"BlobEndpoint={self.endpoint};")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        self.log.close()


@pytest.fixture
def azurite(tmp_path: Path) -> Iterator[Azurite]:
    if importlib.util.find_spec("adlfs") is None:
        pytest.skip("adlfs is not installed (pip install kserve_v2[azure])")
    if not AZURITE_BIN.exists():
        pytest.skip(f"Azurite is not installed at {AZURITE_BIN} (make azurite; needs npm)")
    if shutil.which("node") is None:
        pytest.skip("Azurite needs Node.js (node is not on PATH)")
    emulator = Azurite(tmp_path)
    emulator.fs.mkdir("models")
    emulator.fs.pipe("models/repo/scale/1/model.onnx", scale_model(2.0))
    emulator.fs.pipe("models/repo/scale/config.pbtxt", b'name: "scale"\nbackend: "onnxruntime"\nmax_batch_size: 8\n')
    emulator.fs.pipe("models/repo/other/1/model.onnx", scale_model(3.0))
    yield emulator
    emulator.stop()


AZURE_URL = f"as://{AZURITE_ACCOUNT}/models/repo"


def test_azure_poll_and_explicit(azurite: Azurite, tmp_path: Path) -> None:
    folder = tmp_path / "mount"
    folder.mkdir()
    env = {"AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string(AZURITE_KEY),
           "TRITON_AZURE_MOUNT_DIRECTORY": str(folder)}
    server = start_server(AZURE_URL, tmp_path / "logs", "--model-control-mode", "poll", "--repository-poll-secs", "1",
                          env=env)
    try:
        with grpcclient.InferenceServerClient(server.url) as client:
            assert infer(client, "scale") == 2.0 and infer(client, "other") == 3.0
            assert client.get_model_config("scale").config.max_batch_size == 8  # config.pbtxt from the container
            assert len(list(folder.glob("*/scale/1/model.onnx"))) == 1
            azurite.fs.pipe("models/repo/scale/2/model.onnx", scale_model(4.0))
            wait_until(lambda: client.is_model_ready("scale", "2"), "version 2 READY")
            assert infer(client, "scale") == 4.0 and not client.is_model_ready("scale", "1")
            azurite.fs.rm("models/repo/other", recursive=True)
            wait_until(lambda: not client.is_model_ready("other"), "'other' unloaded")
            wait_until(lambda: {m.name for m in client.get_model_repository_index().models} == {"scale"},
                       "'other' gone from the index")
        assert AZURITE_KEY not in server.log()
    finally:
        assert server.stop() == 0
    folder = tmp_path / "mount2"
    folder.mkdir()
    env["TRITON_AZURE_MOUNT_DIRECTORY"] = str(folder)
    server = start_server(AZURE_URL, tmp_path / "logs", "--model-control-mode", "explicit", env=env)
    try:
        with grpcclient.InferenceServerClient(server.url) as client:
            assert {m.name: m.state for m in client.get_model_repository_index().models} == {"scale": ""}
            assert not list(folder.glob("*/scale"))  # listed without downloading anything
            client.load_model("scale")
            assert infer(client, "scale") == 4.0
            client.unload_model("scale")
            wait_until(lambda: not client.is_model_ready("scale"), "'scale' unloaded")
            with pytest.raises(InferenceServerException, match="failed to poll from model repository"):
                client.load_model("missing")
    finally:
        assert server.stop() == 0


def test_azure_wrong_key_fails_clearly_without_the_secret(azurite: Azurite, tmp_path: Path) -> None:
    wrong = "d3Jvbmcta2V5LW11c3Qtbm90LWFwcGVhci05ODc2NTQzMjE="  # valid base64, not the account's key
    env = {"AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string(wrong)}
    with pytest.raises(RuntimeError) as failed:
        start_server(AZURE_URL, tmp_path / "logs", env=env)
    text = str(failed.value)
    assert "exited with 1" in text and f"model repository '{AZURE_URL}' cannot be read" in text
    assert "authenticate" in text.lower() or "authorization" in text.lower(), text
    assert wrong not in text and AZURITE_KEY not in text and "AccountKey=" + wrong not in text


def test_azure_poll_missing_container_keeps_serving_and_an_empty_prefix_unloads(azurite: Azurite,
                                                                                 tmp_path: Path) -> None:
    """adlfs lists a missing container as empty: the container is asked for, so its loss is an outage (the last
    listing serves on) and only an empty prefix in a container that exists unloads the models."""
    env = {"AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string(AZURITE_KEY)}
    server = start_server(AZURE_URL, tmp_path / "logs", "--model-control-mode", "poll", "--repository-poll-secs", "1",
                          env=env)
    try:
        with grpcclient.InferenceServerClient(server.url) as client:
            assert infer(client, "scale") == 2.0
            azurite.fs.rmdir("models")  # the container, with its blobs
            wait_until(lambda: "no such container 'models'; keeping the last listing" in server.log(),
                       "a failed poll logged")
            assert infer(client, "scale") == 2.0 and _names(client) == {"scale", "other"}
            azurite.fs.mkdir("models")
            wait_until(lambda: _names(client) == set(), "every model unloaded and gone from the index")
            assert not client.is_model_ready("scale") and client.is_server_live()
        assert AZURITE_KEY not in server.log()
    finally:
        assert server.stop() == 0
