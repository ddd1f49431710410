"""plugin/rng.py CpuRandom: dropout masks and random tensors from one seeded CPU generator."""
import torch
import torch.nn.functional as F

import example_models as em
from pytest_ptdbg.plugin.rng import CpuRandom


def _draws(seed):
    x = torch.ones(64, 8)
    with CpuRandom(seed):
        return (F.dropout(x, 0.5, True), torch.rand(3, 4), torch.randn_like(x),
                torch.empty(5).uniform_(2.0, 3.0), torch.bernoulli(torch.full((6,), 0.5)))


def test_same_seed_same_numbers_whatever_the_global_rng():
    torch.manual_seed(1)
    a = _draws(7)
    torch.manual_seed(2)          # the global generator plays no part
    b = _draws(7)
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    assert not torch.equal(_draws(8)[0], a[0])


def test_dropout_semantics():
    x = torch.randn(1000, 4)
    with CpuRandom(0):
        y = F.dropout(x, 0.25, True)
        same = F.dropout(x, 0.25, False)
    dropped = y == 0
    assert 0.2 < dropped.float().mean().item() < 0.3
    torch.testing.assert_close(y[~dropped], x[~dropped] / 0.75)
    assert same is x
    with CpuRandom(0):
        z = torch.empty(4).uniform_(2.0, 3.0)
    assert ((z >= 2.0) & (z < 3.0)).all()


def test_gradients_flow_and_dropout_is_one_recorded_api(tmp_path):
    from pytest_ptdbg.plugin.options import Settings
    from pytest_ptdbg.plugin.run import locate_dump, run_model

    model, batch = em.tiny_gpt(n_layers=1)
    side = run_model(model, batch, em.forward_step, device=torch.device("cpu"), dtype="float32",
                     dump_path=str(tmp_path / "d"), settings=Settings(), summary_only=True)
    with open(locate_dump(side.dump_path, True).pkl_path, encoding="utf-8") as f:
        text = f.read()
    assert '"Functional_dropout_0_forward_input.0"' in text
    assert '"Functional_dropout_0_backward_output.0"' in text   # the mask multiply has a gradient
    assert "Torch_rand_" not in text                            # the CPU draw is not a user API
