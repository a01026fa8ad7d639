"""Unit layer: pure logic, no server process, no tritonclient (``pytest tests/unit``)."""
