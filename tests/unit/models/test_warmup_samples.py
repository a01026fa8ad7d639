"""Warmup samples (kserve_v2.models.warmup, Triton's ``model_warmup``): how each sample's request is built
from its data kind, how a version's instances run them before it is returned, how they count in its
statistics, and the failures with Triton's texts (the core's GenerateWarmupData and WarmUp)."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.models.version import open_version
from kserve_v2.models.warmup import WarmupError, build_samples
from kserve_v2.protocol.datatypes import BY_V2
from kserve_v2.protocol.model_spec import ModelSpec
from kserve_v2.scheduling.ensemble import EnsembleError, check_config
from tests.unit.fakes import Doubling

FP32 = BY_V2["FP32"]
TENSORS = ('input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [2] }] '
           'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [2] }] ')
NO_ID = "[request id: <id_unknown>] "


def config(text: str, instances: int = 1) -> mc.ModelConfig:
    parsed = text_format.Parse('name: "m" ' + TENSORS + text, mc.ModelConfig())
    parsed.instance_group.add(name="m_0", count=instances)
    return parsed


def samples(text: str, model_dir: Path) -> list:
    parsed = config(text)
    return build_samples(parsed, ModelSpec.from_config(parsed), model_dir)


def warmup(inputs: str, batch_size: int = 1, count: int = 1, name: str = "s") -> str:
    return f'model_warmup [{{ name: "{name}" batch_size: {batch_size} count: {count} {inputs} }}]'


def fp32(data: str, dims: str = "[2]", name: str = "INPUT0", data_type: str = "TYPE_FP32") -> str:
    return f'inputs {{ key: "{name}" value: {{ data_type: {data_type} dims: {dims} {data} }} }}'


def test_zero_random_and_file_data(tmp_path: Path) -> None:
    """Zeros; random bytes; a file's first bytes (it may hold more); a batching model's requests get a
    batch dim of 1; count 0 runs once; a batch_size 0 sample is skipped."""
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "data").write_bytes(np.array([1.5, -2.0, 9.0], "<f4").tobytes())
    settings = [f'{{ name: "zero" batch_size: 1 {fp32("zero_data: true")} }}',
                f'{{ name: "file" batch_size: 2 count: 3 {fp32(chr(34).join(["input_data_file: ", "data", ""]))} }}',
                f'{{ name: "random" batch_size: 1 {fp32("random_data: true")} }}',
                f'{{ name: "none" batch_size: 0 {fp32("zero_data: true")} }}']
    built = samples(f"max_batch_size: 4 model_warmup [{', '.join(settings)}]", tmp_path)
    assert [(s.name, s.count, s.batch_size) for s in built] == [("zero", 1, 1), ("file", 3, 2), ("random", 1, 1)]
    zero, file, random = (s.feeds["INPUT0"] for s in built)
    assert zero.tolist() == [[0.0, 0.0]] and zero.dtype == np.float32
    assert file.tolist() == [[1.5, -2.0]]
    assert random.shape == (1, 2) and random.dtype == np.float32
    assert built[0].output_names == ("OUTPUT0",)


def test_strings_zero_and_from_a_file(tmp_path: Path) -> None:
    """BYTES: zero data (and random data, as Triton) are empty strings; a file holds them serialized
    (a 4-byte little-endian length before each)."""
    text = ('input [{ name: "T" data_type: TYPE_STRING dims: [2] }] '
            'output [{ name: "O" data_type: TYPE_STRING dims: [2] }] ')
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "strings").write_bytes(b"".join(struct.pack("<I", len(s)) + s for s in (b"ab", b"")))
    parsed = text_format.Parse('name: "s" ' + text + 'model_warmup [{ name: "z" batch_size: 1 '
                               + fp32("random_data: true", name="T", data_type="TYPE_STRING") + ' }, '
                               + '{ name: "f" batch_size: 1 '
                               + fp32('input_data_file: "strings"', name="T", data_type="TYPE_STRING") + ' }]',
                               mc.ModelConfig())
    zero, file = build_samples(parsed, ModelSpec.from_config(parsed), tmp_path)
    assert zero.feeds["T"].tolist() == [b"", b""]
    assert file.feeds["T"].tolist() == [b"ab", b""]


@pytest.mark.parametrize(("inputs", "expected"), [
    (fp32("zero_data: true", "[-1]"),
     "warmup setting expects all variable-size dimensions are specified for input 'INPUT0'"),
    (fp32(""), f"{NO_ID}warmup setting expects input 'INPUT0' to have input_data_type set"),
    (fp32('input_data_file: "short"'),
     f"{NO_ID}warmup setting expects 8 bytes, but the data provided from shortonly has 4 bytes"),
    (fp32("zero_data: true", "[3]"),
     f"{NO_ID}unexpected shape for input 'INPUT0' for model 'm'. Expected [2], got [3]"),
    (fp32("zero_data: true", data_type="TYPE_INT32"),
     f"{NO_ID}inference input 'INPUT0' data-type is 'INT32', but model 'm' expects 'FP32'"),
])
def test_samples_that_cannot_be_built(tmp_path: Path, inputs: str, expected: str) -> None:
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "short").write_bytes(bytes(4))
    with pytest.raises(WarmupError) as raised:
        samples(warmup(inputs), tmp_path)
    assert str(raised.value) == expected


def test_a_file_linking_out_of_the_folder_is_refused(tmp_path: Path) -> None:
    model_dir = tmp_path / "m"
    (model_dir / "warmup").mkdir(parents=True)
    (tmp_path / "secret").write_bytes(bytes(8))
    os.symlink(tmp_path / "secret", model_dir / "warmup" / "link")
    with pytest.raises(WarmupError, match="input_data_file must be a relative path inside the model folder"):
        samples(warmup(fp32('input_data_file: "link"')), model_dir)


def test_each_instance_runs_each_sample_count_times_and_statistics_count_them(tmp_path: Path) -> None:
    """2 instances, count 3: 6 executions on both instance threads; 6 inferences and 6 executions."""
    executable = Doubling()
    version = open_version("m", 1, config(warmup(fp32("zero_data: true"), count=3), instances=2), executable,
                           model_dir=tmp_path)
    try:
        threads = [thread for thread, _ in executable.calls]
        assert len(threads) == 6 and len(set(threads)) == 2, threads
        assert all(feeds["INPUT0"].tolist() == [0.0, 0.0] for _, feeds in executable.calls)
        stats = version.stats.to_pb("m", 1)
        assert (stats.inference_count, stats.execution_count, stats.inference_stats.success.count) == (6, 6, 6)
        assert [(b.batch_size, b.compute_infer.count) for b in stats.batch_stats] == [(1, 6)]
    finally:
        version.close()


def test_a_batch_sample_is_one_execution(tmp_path: Path) -> None:
    """batch_size 3 on a batching model: one execution of 3 rows (3 requests merged), 3 inferences."""
    executable = Doubling()
    version = open_version("m", 1, config("max_batch_size: 4 " + warmup(fp32("zero_data: true"), batch_size=3)),
                           executable, model_dir=tmp_path)
    try:
        assert [feeds["INPUT0"].shape for _, feeds in executable.calls] == [(3, 2)]
        stats = version.stats.to_pb("m", 1)
        assert (stats.inference_count, stats.execution_count) == (3, 1)
        assert [(b.batch_size, b.compute_infer.count) for b in stats.batch_stats] == [(3, 1)]
    finally:
        version.close()


def test_a_batch_above_max_batch_size_is_refused_as_tritons_backends_refuse_it(tmp_path: Path) -> None:
    executable = Doubling()
    with pytest.raises(WarmupError) as raised:
        open_version("m", 1, config(warmup(fp32("zero_data: true"), batch_size=2)), executable, model_dir=tmp_path)
    assert str(raised.value) == ("failed to run warmup sample 's': batch size 2 for 'm_0_0', max allowed is 0; "
                                 "batch size 2 for 'm_0_0', max allowed is 0; ")
    assert executable.calls == [] and executable.closed


def test_a_failing_execution_fails_the_load_and_closes_the_version(tmp_path: Path) -> None:
    executable = Doubling(failure="boom")
    with pytest.raises(WarmupError) as raised:
        open_version("m", 1, config(warmup(fp32("zero_data: true"), count=5, name="zero sample")), executable,
                     model_dir=tmp_path)
    assert str(raised.value) == "failed to run warmup sample 'zero sample': boom; "
    assert len(executable.calls) == 1 and executable.closed  # warmup ends at the first failure


def test_no_model_folder_means_no_warmup() -> None:
    executable = Doubling()
    version = open_version("m", 1, config(warmup(fp32("zero_data: true"))), executable)
    try:
        assert executable.calls == [] and version.stats.execution_count == 0
    finally:
        version.close()


def test_an_ensemble_refuses_model_warmup() -> None:
    """Triton's ``ValidateEnsembleSchedulingConfig`` text (an ensemble has no instance to warm up)."""
    parsed = text_format.Parse('name: "e" platform: "ensemble" ' + TENSORS
                               + 'ensemble_scheduling { step [{ model_name: "m" model_version: -1 '
                               'input_map { key: "INPUT0" value: "INPUT0" } output_map { key: "OUTPUT0" value: "OUTPUT0" } }] } '
                               + warmup(fp32("zero_data: true")), mc.ModelConfig())
    with pytest.raises(EnsembleError) as raised:
        check_config(parsed)
    assert str(raised.value) == "model_warmup can not be specified for ensemble 'e'"
