"""The V2 / Triton REST routes: inference with JSON and binary tensor data, metadata, health,
Triton's extensions beside inference, and the generate extension."""
