"""Build the servable versions of one model from its folder (blocking; run off the event loop)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from kserve_v2 import backend
from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.backend.host import BackendHost
from kserve_v2.models.version import ModelVersion, open_version
from kserve_v2.repository import config as cfg
from kserve_v2.repository import config_fields, layout
from kserve_v2.runtime.onnx import confined_file
from kserve_v2.scheduling import ensemble
from kserve_v2.scheduling.sequence_config import SequenceSettings

log = logging.getLogger(__name__)


@dataclass
class LoadResult:
    """What loading a model produced.

    Attributes:
        config: the completed configuration (None when it could not be read).
        loaded: version -> servable version.
        failed: version -> failure reason (the backend's error, without host paths).
        error: a failure of the whole model (configuration, no versions), else "".
        ensemble_versions: an ensemble's versions to build once its composing models are loaded
            (the model manager does it; ``kserve_v2.scheduling.ensemble``).
        labels: output name -> the lines of its ``label_filename`` (the classification extension).
    """

    config: mc.ModelConfig | None = None
    loaded: dict[int, ModelVersion] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)
    error: str = ""
    ensemble_versions: list[int] = field(default_factory=list)
    labels: dict[str, tuple[str, ...]] = field(default_factory=dict)


def load_model(model_dir: Path, name: str, gpus: int, override_json: str | None, host: BackendHost) -> LoadResult:
    """Read the configuration, pick versions by policy, and open each version with its backend, for
    the server ``host`` (its backends get it; its rate limiter takes the versions' instances).

    The newest version's interface auto-completes the configuration (unless the host's
    ``model_load.auto_complete`` is off: ``--disable-auto-complete-config``); the others are validated
    against it. A version that fails is tried again up to ``model_load.retry_count`` times
    (``--model-load-retry-count``, as Triton's model lifecycle). Never raises: every failure becomes
    a reason in the result.
    """
    result = LoadResult()
    settings = host.model_load
    try:
        config = cfg.read_config(model_dir, name, override_json, settings.config_name, settings.auto_complete)
        config_fields.check(config)  # refuses the fields this server does not act on, warns once for others'
        if ensemble.is_ensemble(config):
            ensemble.check_config(config)
        else:
            cfg.complete_instances(config, gpus)
    except (cfg.ConfigError, ensemble.EnsembleError, config_fields.UnsupportedField) as err:
        result.error = str(err)
        return result
    versions = layout.select_versions(layout.version_dirs(model_dir), config.version_policy)
    if not versions:
        result.error = f"at least one version must be available under the version policy of model '{name}'"
        return result
    try:
        result.labels = read_labels(model_dir, config)
    except ValueError as err:
        result.error = str(err)
        return result
    if ensemble.is_ensemble(config):
        result.config, result.ensemble_versions = config, versions
        return result
    found = backend.find(config.backend)
    assert found is not None  # read_config accepts only known backends
    completed = not settings.auto_complete
    for version in sorted(versions, reverse=True):
        for attempt in range(settings.retry_count + 1):
            try:
                result.loaded[version] = _open(found, model_dir, name, version, config, completed, result.labels, host)
                completed = True
                result.failed.pop(version, None)
                break
            except Exception as err:  # noqa: BLE001 - any load failure is reported as the version's reason
                # the version's reason, as Triton's index shows it
                result.failed[version] = _without_paths(err, model_dir)
                if attempt < settings.retry_count:
                    log.warning("failed to load '%s' version %d (attempt %d of %d), retrying: %s", name, version,
                                attempt + 1, settings.retry_count + 1, result.failed[version])
    result.config = config
    return result


def _open(found: backend.Backend, model_dir: Path, name: str, version: int, config: mc.ModelConfig, completed: bool,
          labels: dict[str, tuple[str, ...]], host: BackendHost) -> ModelVersion:
    """Open one version with its backend; the first (``completed`` false) auto-completes ``config``'s tensors.

    Raises:
        Exception: whatever the backend, the configuration checks or the version's set-up raise.
    """
    executable = found.open_model(model_dir, version, config, host)
    if not completed:
        cfg.complete_tensors(config, executable.inputs, executable.outputs, executable.batchable,
                             host.backend_config.default_max_batch_size_of(config.backend))
    # sequence controls are checked before the other tensors, as Triton's onnxruntime backend does
    sequence = (SequenceSettings.from_config(config, model_dir, executable.inputs, executable.outputs)
                if config.HasField("sequence_batching") else None)
    cfg.validate(config, executable.inputs, executable.outputs)
    return open_version(name, version, config, executable, sequence, labels,
                        model_dir,  # model_dir: warmup data files (model_warmup)
                        host.rate_limiter)


def read_labels(model_dir: Path, config: mc.ModelConfig) -> dict[str, tuple[str, ...]]:
    """The labels of every output that names a ``label_filename`` (a path inside the model folder):
    one label per line, as Triton reads them; an empty line is an index without a label.

    Raises:
        ValueError: a path leaving the folder, or a file that cannot be read as UTF-8 text
            ("model '<m>': label_filename '<f>' of output '<o>' cannot be read: <reason>").
    """
    labels = {}
    for output in config.output:
        if not output.label_filename:
            continue
        path = confined_file(model_dir, Path(output.label_filename), "label_filename", config.name)
        try:
            lines = path.read_text(encoding="utf-8").split("\n")
        except (OSError, UnicodeDecodeError) as err:
            reason = err.strerror if isinstance(err, OSError) and err.strerror else type(err).__name__
            raise ValueError(f"model '{config.name}': label_filename '{output.label_filename}' of output "
                             f"'{output.name}' cannot be read: {reason}") from None
        labels[output.name] = tuple(lines[:-1] if lines and not lines[-1] else lines)
    return labels


def _without_paths(err: Exception, model_dir: Path) -> str:
    """A backend's error text with the model folder's host path replaced by ``<model folder>``
    (reasons are served to clients: RepositoryIndex, load errors)."""
    text = str(err)
    for prefix in {str(model_dir.resolve()), str(model_dir)}:
        text = text.replace(prefix, "<model folder>")
    return text

