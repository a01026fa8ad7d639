"""Describe protobuf files as plain data, to compare two compilations of the same schema.

Imports no generated module itself, so it can run beside either ours or tritonclient's.
"""

from __future__ import annotations

from google.protobuf.descriptor import Descriptor, FileDescriptor


def schema(files: list[FileDescriptor]) -> dict[str, object]:
    """Every message's fields (name -> [number, type, label, type name]), every enum and RPC."""
    out: dict[str, object] = {}

    def walk(message: Descriptor) -> None:
        out[message.full_name] = {
            f.name: [f.number, f.type, f.is_repeated, f.message_type.full_name if f.message_type else ""]
            for f in message.fields
        }
        for enum in message.enum_types:
            out[enum.full_name] = {v.name: v.number for v in enum.values}
        for nested in message.nested_types:
            walk(nested)

    for file in files:
        for message in file.message_types_by_name.values():
            walk(message)
        for enum in file.enum_types_by_name.values():
            out[enum.full_name] = {v.name: v.number for v in enum.values}
        for service in file.services_by_name.values():
            out[service.full_name] = {
                m.name: [m.input_type.full_name, m.output_type.full_name, m.client_streaming, m.server_streaming]
                for m in service.methods
            }
    return out
