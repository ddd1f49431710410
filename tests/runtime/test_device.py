import torch

from pytest_ptdbg.runtime.device import available_devices, has_npu, seed_devices


def test_devices_on_this_machine():
    devs = available_devices()
    assert devs[0] == "cpu"
    assert ("cuda" in devs) == torch.cuda.is_available()
    assert ("npu" in devs) == has_npu()


def test_seed_devices_is_safe_without_accelerators():
    seed_devices(3)  # no accelerator here: must not raise
    torch.manual_seed(3)
    a = torch.rand(2)
    torch.manual_seed(3)
    seed_devices(3)
    assert torch.equal(a, torch.rand(2))
