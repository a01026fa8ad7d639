"""The model configuration as python models read and auto-complete it (Triton's python backend:
``pb_utils.ModelConfig``, given to ``TritonPythonModel.auto_complete_config``, and the helpers
``get_input_config_by_name`` and the like, which read the JSON ``args["model_config"]``).

The configuration travels as Triton's JSON (``kserve_v2.protocol.json_pb``: field names as in the .proto,
defaults printed, 64-bit integers as numbers). ``auto_complete_config`` may set ``max_batch_size``,
add inputs and outputs, turn on dynamic batching and set the transaction policy; what it returns is
parsed back into the version's configuration (``complete``), with the texts Triton gives when it
contradicts ``config.pbtxt``.
"""

from __future__ import annotations

import json
from typing import Any

from google.protobuf import json_format

from kserve_v2._proto import model_config_pb2 as mc
from kserve_v2.protocol.json_pb import message_to_json

_TENSOR_KEYS = {"input": ("name", "data_type", "dims", "optional"), "output": ("name", "data_type", "dims")}


class ModelConfig:
    """The configuration ``auto_complete_config`` receives and returns (Triton's ``pb_utils.ModelConfig``).

    Args:
        model_config: the configuration as Triton's JSON text.
    """

    def __init__(self, model_config: str) -> None:
        self._model_config: dict[str, Any] = json.loads(model_config)

    def as_dict(self) -> dict[str, Any]:
        """The configuration as a dict (read it; change it through the setters)."""
        return self._model_config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Set ``max_batch_size``.

        Raises:
            ValueError: the configuration already sets a larger one.
        """
        configured = self._model_config["max_batch_size"]
        if configured > max_batch_size:
            raise ValueError(f"configuration specified max_batch_size {configured}, but in auto-complete-config "
                             f"function for model '{self._name}' specified max_batch_size {max_batch_size}")
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        """Turn on dynamic batching, unless another scheduler is configured.

        Raises:
            ValueError: the configuration has ``sequence_batching`` or ``ensemble_scheduling``.
        """
        for scheduler in ("sequence_batching", "ensemble_scheduling"):
            if scheduler in self._model_config:
                raise ValueError(f"Configuration specified scheduling_choice as '{scheduler}', but auto-complete-config "
                                 f"function for model '{self._name}' tries to set scheduling_choice as "
                                 "'dynamic_batching'")
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:  # noqa: A002 - Triton's parameter name
        """Add an input (``name``, ``data_type``, ``dims``, optional ``optional``), or complete the
        configured one of that name.

        Raises:
            ValueError: other keys, a missing key, or a datatype, dims or optional flag that differs
                from the configured input's.
        """
        self._add("input", input)

    def add_output(self, output: dict[str, Any]) -> None:
        """Add an output (``name``, ``data_type``, ``dims``), or complete the configured one of that name.

        Raises:
            ValueError: as ``add_input``.
        """
        self._add("output", output)

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        """Set ``model_transaction_policy`` (its one key: ``decoupled``).

        Raises:
            ValueError: another key, or a ``decoupled`` that differs from the configured one.
        """
        if any(key != "decoupled" for key in transaction_policy_dict):
            raise ValueError(f"model transaction property in auto-complete-config function for model '{self._name}' "
                             "contains property other than 'decoupled'.")
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = transaction_policy_dict["decoupled"]
            if "decoupled" in policy and policy["decoupled"] != wanted:
                raise ValueError(f"trying to change decoupled property in auto-complete-config for model "
                                 f"'{self._name}', which is already set to '{policy['decoupled']}'.")
            policy["decoupled"] = wanted

    @property
    def _name(self) -> str:
        return str(self._model_config.get("name", ""))

    def _add(self, kind: str, tensor: dict[str, Any]) -> None:
        allowed = _TENSOR_KEYS[kind]
        name = tensor.get("name", "")
        if any(key not in allowed for key in tensor):
            listed = "'" + "', '".join(allowed[:-1]) + f"' and '{allowed[-1]}'"
            raise ValueError(f"{kind} '{name}' in auto-complete-config function for model '{self._name}' contains "
                             f"property other than {listed}.")
        if "name" not in tensor:
            raise ValueError(f"{kind} in auto-complete-config function for model '{self._name}' is missing 'name' "
                             "property.")
        for key in ("data_type", "dims"):
            if key not in tensor:
                raise ValueError(f"{kind} '{name}' in auto-complete-config function for model '{self._name}' is "
                                 f"missing '{key}' property.")
        for current in self._model_config.setdefault(kind, []):
            if current["name"] != name:
                continue
            if current.get("data_type", "TYPE_INVALID") not in ("TYPE_INVALID", tensor["data_type"]):
                raise ValueError(f"unable to load model '{self._name}', configuration expects datatype "
                                 f"{current['data_type']} for {kind} '{name}', model provides {tensor['data_type']}")
            if current.get("dims") and list(current["dims"]) != list(tensor["dims"]):
                raise ValueError(f"model '{self._name}', tensor '{name}': the model expects dims {tensor['dims']} but "
                                 f"the model configuration specifies dims {current['dims']}")
            if "optional" in tensor and "optional" in current and current["optional"] != tensor["optional"]:
                raise ValueError(f"model '{self._name}', tensor '{name}': the model expects optional "
                                 f"{tensor['optional']} but the model configuration specifies optional "
                                 f"{current['optional']}")
            current.update(data_type=tensor["data_type"], dims=list(tensor["dims"]))
            if "optional" in tensor:
                current["optional"] = tensor["optional"]
            return
        self._model_config[kind].append(dict(tensor))


def config_json(config: mc.ModelConfig) -> str:
    """The configuration as Triton's JSON text (``args["model_config"]``)."""
    return json.dumps(message_to_json(config))


def complete(config: mc.ModelConfig, completed: ModelConfig) -> None:
    """Take what ``auto_complete_config`` returned into ``config`` (in place).

    Raises:
        ValueError: what it returned is no ``ModelConfig``, or no longer a valid configuration.
    """
    if not isinstance(completed, ModelConfig):
        raise ValueError(f"auto_complete_config function in model '{config.name}' must return a valid "
                         "pb.ModelConfig object.")
    parsed = mc.ModelConfig()
    try:
        json_format.ParseDict(completed.as_dict(), parsed)
    except json_format.ParseError as err:
        raise ValueError(f"auto_complete_config function in model '{config.name}' returned a configuration that "
                         f"does not parse: {err}") from None
    config.CopyFrom(parsed)


def tensor_config(model_config: dict[str, Any], kind: str, name: str) -> dict[str, Any] | None:
    """The configured ``input`` or ``output`` named ``name`` in Triton's JSON dict, or None."""
    for tensor in model_config.get(kind, ()):
        if tensor["name"] == name:
            return dict(tensor)
    return None
