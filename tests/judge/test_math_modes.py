"""The math modes a call ran under (autocast, oneDNN off) are recorded in its call spec and the
judgement's reference replays under them: a correct composite kernel that computes inside in a lower
precision than its outputs (PyTorch's own LSTM under bf16 autocast) is within budget, and a faulty
kernel in the same step is still the root cause."""
import json

import pytest

from real_dumps import dump_user_step, patched, relu_times

torch = pytest.importorskip("torch")

from pytest_ptdbg.dump.call_spec import encode_call, encode_call_json, math_modes  # noqa: E402
from pytest_ptdbg.errors import ReplayRefused  # noqa: E402
from pytest_ptdbg.judge import judge_dump  # noqa: E402
from pytest_ptdbg.replayer.modes import recorded_modes  # noqa: E402


def test_math_modes_are_none_by_default_and_name_autocast_and_onednn():
    x = torch.ones(2, 3)
    assert math_modes((x,), {}) is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert math_modes((x,), {}) == {"autocast": "torch.bfloat16"}
        assert math_modes(([x, x],), {"dim": 0}) == {"autocast": "torch.bfloat16"}
        assert math_modes((3,), {}) is None  # no tensor: no device whose autocast applies
    with torch.backends.mkldnn.flags(enabled=False):
        assert math_modes((x,), {}) == {"mkldnn": False}
    modes = {"autocast": "torch.float16", "mkldnn": False}
    assert json.loads(encode_call_json((x, 1), {"dim": -1}, modes)) == encode_call((x, 1), {"dim": -1}, modes)
    assert json.loads(encode_call_json((x, 1), {"dim": -1}, modes))["modes"] == modes


@pytest.mark.parametrize("raw", [[1], {"autocast": "os.system"}, {"mkldnn": "no"}, {"tf32": True}])
def test_a_crafted_modes_field_is_refused_naming_it(raw):
    with pytest.raises(ReplayRefused, match="modes"):
        recorded_modes({"args": [], "kwargs": {}, "modes": raw}, "VF_lstm_0_forward")


def _autocast_lstm_step(relu_scale=None):
    torch.manual_seed(0)
    lstm, proj = torch.nn.LSTM(8, 16, batch_first=True), torch.nn.Linear(16, 4)
    x = torch.randn(4, 6, 8)

    def step():
        # PyTorch's own LSTM kernel (oneDNN's needs bf16 instructions some CPUs lack), on float32
        # inputs: float32 outputs, its gates computed in bf16 by autocast
        with torch.backends.mkldnn.flags(enabled=False), torch.autocast("cpu", dtype=torch.bfloat16):
            out, _ = lstm(x)
            torch.relu(proj(out)).float().pow(2).mean().backward()

    if relu_scale is None:
        return step

    def faulty():
        with patched(torch, "relu", relu_times(relu_scale)(torch.relu)):
            step()
    return faulty


def test_a_native_lstm_under_bf16_autocast_is_within_budget(tmp_path):
    dump = dump_user_step(tmp_path, _autocast_lstm_step())
    j = judge_dump(dump.rank_dir)
    assert j.passed, j.text()
    lstm = [v for v in j.verdicts if v.api.startswith("VF_lstm_0")]
    assert {str(v.status) for v in lstm} == {"within budget"}, j.text()
    assert all(v.compute_dtype == "torch.float32" and v.ratio <= 1.0 for v in lstm), j.text()


def test_a_faulty_kernel_under_autocast_is_still_the_root_cause(tmp_path):
    dump = dump_user_step(tmp_path, _autocast_lstm_step(relu_scale=1.05))
    j = judge_dump(dump.rank_dir)
    assert {v.api for v in j.root_causes} <= {"Torch_relu_0_forward", "Torch_relu_0_backward"}, j.text()
    assert "Torch_relu_0_forward" in {v.api for v in j.root_causes}, j.text()
