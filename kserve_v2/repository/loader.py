"""Build the servable versions of one model from its folder (blocking; run off the event loop)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.model import ModelVersion
from kserve_v2.repository import config as cfg
from kserve_v2.repository import layout
from kserve_v2.runtime.onnx import OnnxSession, session_options


@dataclass
class LoadResult:
    """What loading a model produced.

    Attributes:
        config: the completed configuration (None when it could not be read).
        loaded: version -> servable version.
        failed: version -> failure reason.
        error: a failure of the whole model (configuration, no versions), else "".
    """

    config: mc.ModelConfig | None = None
    loaded: dict[int, ModelVersion] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)
    error: str = ""


def load_model(model_dir: Path, name: str, gpus: int, override_json: str | None = None) -> LoadResult:
    """Read the configuration, pick versions by policy, and create one ORT session per version.

    The newest version's graph auto-completes the configuration; the others are validated
    against it. Never raises: every failure becomes a reason in the result.
    """
    result = LoadResult()
    try:
        config = cfg.read_config(model_dir, name, override_json)
        cfg.complete_instances(config, gpus)
    except cfg.ConfigError as err:
        result.error = str(err)
        return result
    versions = layout.select_versions(layout.version_dirs(model_dir), config.version_policy)
    if not versions:
        result.error = f"at least one version must be available under the version policy of model '{name}'"
        return result
    completed = False
    for version in sorted(versions, reverse=True):
        try:
            session = _open_session(model_dir, version, config)
            if not completed:
                cfg.complete_tensors(config, session.inputs, session.outputs)
            cfg.validate(config, session.inputs, session.outputs)
            completed = True
            result.loaded[version] = ModelVersion(name, version, config, session)
        except Exception as err:  # noqa: BLE001 - any load failure is reported as the version's reason
            result.failed[version] = f"failed to load model '{name}' version {version}: {err}"
    result.config = config
    return result


def _open_session(model_dir: Path, version: int, config: mc.ModelConfig) -> OnnxSession:
    path = cfg.model_file(model_dir, version, config)
    if not path.is_file():
        raise FileNotFoundError(f"model file '{path.relative_to(model_dir)}' not found")
    parameters = {key: value.string_value for key, value in config.parameters.items()}
    options = session_options(parameters, config.optimization.graph.level)
    group = config.instance_group[0]
    use_cuda = group.kind == mc.ModelInstanceGroup.KIND_GPU
    return OnnxSession(path, options, use_cuda, group.gpus[0] if use_cuda else 0)
