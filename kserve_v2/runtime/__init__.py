"""Model runtimes: ONNX Runtime sessions and device detection."""
