"""``--backend-config=python,<setting>=<value>``: Triton's python backend shared memory settings and
``stub-timeout-seconds`` with their texts, the server-wide ``execution-mode``; other backends and
settings refused, naming them."""

from __future__ import annotations

import pytest

from kserve_v2.settings.backend_config import PythonBackendConfig, parse_backend_config


def test_defaults_are_tritons() -> None:
    assert parse_backend_config(()).python == PythonBackendConfig(1 << 20, 1 << 20, "triton_python_backend_shm_region_",
                                                                  30, "in_process")


def test_the_python_settings_are_read() -> None:
    config = parse_backend_config(["python,shm-default-byte-size=4194304", "python,shm-growth-byte-size=65536",
                                   "python,shm-region-prefix-name=mine_", "python,stub-timeout-seconds=5",
                                   "python,execution-mode=process"])
    assert config.python == PythonBackendConfig(4 << 20, 65536, "mine_", 5, "process")


@pytest.mark.parametrize(("value", "text"), [
    ("python", "--backend-config option format is '<backend name>,<setting>=<value>'. Got python"),
    ("tensorrt,coalesce-request-input=1", "backend 'tensorrt' has no settings here"),
    ("python,shm_message_queue_size=30", "python setting 'shm_message_queue_size' is not supported"),
    ("python,stub-timeout-seconds=0", "stub-timeout-seconds can't be smaller than or equal to zero."),
    ("python,stub-timeout-seconds=soon", "python setting 'stub-timeout-seconds' must be an integer, got 'soon'"),
    ("python,execution-mode=elsewhere", "python setting 'execution-mode' must be one of 'in_process', 'process', not "
                                        "'elsewhere'"),
    ("python,shm-growth-byte-size=lots", "python setting 'shm-growth-byte-size' must be an integer, got 'lots'"),
    ("python,shm-default-byte-size=1024", "shm-default-byte-size can't be smaller than 4 MiBs"),
    ("python,shm-growth-byte-size=0", "shm-growth-byte-size can't be smaller than or equal to zero."),
    ("python,shm-region-prefix-name=", "shm-region-prefix-name must at least contain one character."),
])
def test_what_is_refused(value: str, text: str) -> None:
    with pytest.raises(ValueError) as raised:
        parse_backend_config([value])
    assert text in str(raised.value)
