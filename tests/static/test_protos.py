"""The .proto files: generated modules are fresh, and the wire schema matches tritonclient's.

Our generated modules and tritonclient's register the same protobuf symbols, so ours are only
imported in subprocesses here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tritonclient.grpc import model_config_pb2, service_pb2

from helpers import ROOT
from proto_schema import schema

GENERATED = ROOT / "kserve_v2" / "_proto"
DUMP = """
import json, sys
from kserve_v2._proto import grpc_service_pb2, model_config_pb2
sys.path.insert(0, "tests/static")
from proto_schema import schema
print(json.dumps(schema([grpc_service_pb2.DESCRIPTOR, model_config_pb2.DESCRIPTOR])))
"""


def test_generated_modules_are_fresh(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-Ikserve_v2/_proto=protos", f"--python_out={out}",
         f"--pyi_out={out}", f"--grpc_python_out={out}", "kserve_v2/_proto/model_config.proto",
         "kserve_v2/_proto/grpc_service.proto"],
        cwd=ROOT, check=True,
    )
    fresh = sorted((out / "kserve_v2" / "_proto").iterdir())
    assert [p.name for p in fresh] == sorted(p.name for p in GENERATED.iterdir() if p.suffix in (".py", ".pyi") and p.name != "__init__.py")
    for path in fresh:
        assert path.read_bytes() == (GENERATED / path.name).read_bytes(), f"{path.name} is stale: run `make proto`"


def test_wire_schema_matches_tritonclient() -> None:
    """Every message, field number, type, enum value and RPC tritonclient knows is ours too."""
    ours = json.loads(subprocess.run([sys.executable, "-c", DUMP], cwd=ROOT, check=True, capture_output=True,
                                     text=True).stdout)
    theirs = schema([service_pb2.DESCRIPTOR, model_config_pb2.DESCRIPTOR])
    assert len(ours["inference.GRPCInferenceService"]) == 20
    missing = sorted(set(theirs) - set(ours))
    assert not missing, f"messages tritonclient has and we lack: {missing}"
    for name, fields in theirs.items():
        assert ours[name] == fields, f"{name} differs from tritonclient's"


def test_any_triton_config_parses(tmp_path: Path) -> None:
    config = tmp_path / "config.pbtxt"
    config.write_text("""
name: "everything" platform: "onnxruntime_onnx" backend: "onnxruntime" runtime: "" max_batch_size: 8
version_policy: { specific: { versions: [1, 3] } }
input [{ name: "data_0" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [3, 224, 224]
         reshape: { shape: [1, 3, 224, 224] } allow_ragged_batch: false optional: true }]
output [{ name: "fc6_1" data_type: TYPE_FP32 dims: [1000] reshape: { shape: [1, 1000, 1, 1] }
          label_filename: "labels.txt" }]
batch_input [{ kind: BATCH_ELEMENT_COUNT target_name: "N" data_type: TYPE_INT32 source_input: "data_0" }]
batch_output [{ target_name: "fc6_1" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "data_0" }]
optimization { graph { level: 1 } priority: PRIORITY_MAX cuda { graphs: true graph_spec [{ batch_size: 1
  input { key: "data_0" value { dim: [3, 224, 224] } } }] }
  execution_accelerators { gpu_execution_accelerator [{ name: "tensorrt" parameters { key: "precision_mode" value: "FP16" } }] }
  input_pinned_memory { enable: true } gather_kernel_buffer_threshold: 2 eager_batching: true }
dynamic_batching { preferred_batch_size: [4, 8] max_queue_delay_microseconds: 100 preserve_ordering: true
  priority_levels: 2 default_priority_level: 1
  default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 5 allow_timeout_override: true max_queue_size: 8 }
  priority_queue_policy { key: 1 value { max_queue_size: 4 } } }
instance_group [{ name: "g" kind: KIND_GPU count: 2 gpus: [0] profile: ["p"] passive: false host_policy: "h"
  rate_limiter { resources [{ name: "R" global: true count: 1 }] priority: 1 }
  secondary_devices [{ kind: KIND_NVDLA device_id: 0 }] }]
default_model_filename: "model.onnx" cc_model_filenames { key: "7.5" value: "m.plan" }
metric_tags { key: "team" value: "a" }
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
model_warmup [{ name: "w" batch_size: 1 count: 2 inputs { key: "data_0" value: { data_type: TYPE_FP32 dims: [3, 224, 224] zero_data: true } } }]
model_operations { op_library_filename: ["libop.so"] }
model_transaction_policy { decoupled: false }
model_repository_agents { agents [{ name: "checksum" parameters { key: "k" value: "v" } }] }
response_cache { enable: true }
model_metrics { metric_control [{ metric_identifier { family: "nv_inference_request_duration_us" }
  histogram_options { buckets: [100, 500] } }] }
""")
    sequence = tmp_path / "sequence.pbtxt"
    sequence.write_text("""
name: "seq" sequence_batching { max_sequence_idle_microseconds: 10000000
  control_input [{ name: "START" control [{ kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1] }] },
                 { name: "CORRID" control [{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }] }]
  state [{ input_name: "i" output_name: "o" data_type: TYPE_FP32 dims: [1]
           initial_state [{ data_type: TYPE_FP32 dims: [1] zero_data: true name: "s" }] }]
  oldest { max_candidate_sequences: 1024 preferred_batch_size: [2] max_queue_delay_microseconds: 10000 preserve_ordering: true } }
""")
    ensemble = tmp_path / "ensemble.pbtxt"
    ensemble.write_text('name: "e" ensemble_scheduling { step [{ model_name: "a" model_version: -1 '
                        'input_map { key: "x" value: "y" } output_map { key: "o" value: "p" } }] }')
    script = ("import sys\nfrom google.protobuf import text_format\nfrom kserve_v2._proto import model_config_pb2 as mc\n"
              "for p in sys.argv[1:]:\n    print(text_format.Parse(open(p).read(), mc.ModelConfig()).name)\n")
    done = subprocess.run([sys.executable, "-c", script, str(config), str(sequence), str(ensemble)], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["everything", "seq", "e"]
