"""One exception hierarchy: every error raised on purpose is a PtdbgError and keeps its built-in base."""
import pytest
import torch

import pytest_ptdbg
from pytest_ptdbg import errors


def test_every_public_error_derives_from_the_base():
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.PtdbgError), name


def test_a_bad_configuration_is_a_config_error_and_a_value_error(tmp_path):
    dbg = pytest_ptdbg.PrecisionDebugger(dump_path=str(tmp_path), hook_name="dump", step=[0])
    with pytest.raises(errors.ConfigError, match="mode") as info:
        dbg.configure_hook(mode="no_such_mode")
    assert isinstance(info.value, ValueError)


def test_a_missing_device_is_device_unavailable():
    from pytest_ptdbg.runtime.device import resolve_device

    with pytest.raises(errors.DeviceUnavailable):
        resolve_device("npu")
    assert torch.device("cpu") == resolve_device("cpu")
