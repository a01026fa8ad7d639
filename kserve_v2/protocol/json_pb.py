"""Protobuf messages as Triton's JSON: field names as in the .proto, defaults printed, enums
by name, and 64-bit integers as JSON numbers (protobuf's JSON mapping prints them as strings;
Triton rewrites them: the model configuration extension, ``extension_model_configuration.md``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

if TYPE_CHECKING:
    from google._upb._message import Descriptor as UpbDescriptor

_INT64_TYPES = frozenset({FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
                          FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64})


def message_to_json(message: Message) -> dict[str, Any]:
    """Render a message as a JSON-ready dict in Triton's style."""
    data = json_format.MessageToDict(message, preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)
    _numbers(message.DESCRIPTOR, data)
    return data


def _numbers(descriptor: Descriptor | UpbDescriptor, data: dict[str, Any]) -> None:
    for field in descriptor.fields:
        if field.name not in data:
            continue
        value = data[field.name]
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            for key, item in value.items():
                value[key] = _convert(value_field, item)
        elif field.is_repeated:
            data[field.name] = [_convert(field, item) for item in value]
        else:
            data[field.name] = _convert(field, value)


def _convert(field: FieldDescriptor, value: Any) -> Any:
    if field.message_type is not None:
        _numbers(field.message_type, value)
        return value
    if field.type in _INT64_TYPES:
        return int(value)
    return value
