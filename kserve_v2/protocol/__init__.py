"""The V2 / Triton data model: errors, datatypes, tensor bytes, a model's tensor interface,
protobuf messages as Triton's JSON, and per-version statistics. Imports only the codec and the
generated messages."""
