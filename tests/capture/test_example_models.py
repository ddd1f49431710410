"""The example models: they train, they are deterministic, and the planted fault is real."""
from __future__ import annotations

import math

import pytest
import torch

import example_models as em
from pytest_ptdbg.format import records
from pathlib import Path

SMALL = dict(em.MODELS)
SMALL["bench_mlp"] = em.bench_mlp
SMALL["bench_transformer_small"] = lambda seed=0: em.bench_transformer(
    seed, batch_size=2, seq_len=8, d_model=32, n_heads=4, n_layers=2)


def _steps(model, batch, n, **kw):
    losses = []
    for _ in range(n):
        torch.manual_seed(0)  # same dropout masks every step
        losses.append(float(em.train_step(model, batch, **kw)))
    return losses


@pytest.mark.parametrize("name", sorted(SMALL))
def test_train_step_updates_and_loss_decreases(name):
    model, batch = SMALL[name]()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    losses = _steps(model, batch, 3)
    assert all(math.isfinite(x) for x in losses)
    assert losses[2] < losses[0], losses
    changed = [k for k, v in model.state_dict().items()
               if v.is_floating_point() and not torch.equal(v, before[k])]
    assert changed, "optimizer step changed no parameter"
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_model_call_with_targets_is_the_loss(name):
    model, batch = SMALL[name]()
    model.eval()
    out = model(batch[0])
    loss = model(*batch)
    assert loss.dim() == 0 and loss.requires_grad
    assert torch.equal(loss, model.loss(batch))
    assert torch.equal(loss, model.criterion(out, batch[1]))


@pytest.mark.parametrize("name", sorted(em.MODELS))
def test_same_seed_same_model_and_batch_other_seed_differs(name):
    factory = em.MODELS[name]
    rng_before = torch.get_rng_state()
    m1, b1 = factory(seed=3)
    assert torch.equal(torch.get_rng_state(), rng_before), "factory changed the global RNG"
    m2, b2 = factory(seed=3)
    m3, b3 = factory(seed=4)
    for (k, v1), v2 in zip(m1.state_dict().items(), m2.state_dict().values()):
        assert torch.equal(v1, v2), k
    assert all(torch.equal(x, y) for x, y in zip(b1, b2))
    assert not all(torch.equal(x, y) for x, y in zip(b1, b3))
    assert _steps(m1, b1, 2) == _steps(m2, b2, 2)


def test_train_step_optimizer_choice_and_bad_name():
    model, batch = em.mlp()
    assert isinstance(em.make_optimizer(model), torch.optim.SGD)
    assert isinstance(em.make_optimizer(model, optimizer="AdamW"), torch.optim.AdamW)
    gpt, _ = em.tiny_gpt()
    assert isinstance(em.make_optimizer(gpt), torch.optim.AdamW)
    with pytest.raises(ValueError, match="optimizer='lbfgs'"):
        em.train_step(model, batch, optimizer="lbfgs")


def test_forward_step_leaves_weights_unchanged():
    model, batch = em.cnn()
    before = [p.detach().clone() for p in model.parameters()]
    loss = em.forward_step(model, batch)
    assert not loss.requires_grad and math.isfinite(float(loss))
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_tiny_gpt_tied_and_untied_head():
    tied, _ = em.tiny_gpt()
    untied, batch = em.tiny_gpt(tie_weights=False)
    assert tied.head.weight is tied.tok_emb.weight
    assert untied.head.weight is not untied.tok_emb.weight
    assert math.isfinite(float(em.train_step(untied, batch)))
    with pytest.raises(ValueError, match="block_size"):
        tied(torch.zeros(1, 17, dtype=torch.long))


@pytest.mark.parametrize("name", sorted(em.MODELS))
def test_bf16_autocast_and_bf16_weights(name):
    model, batch = em.MODELS[name]()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = em.train_step(model, batch)
    assert math.isfinite(float(loss))
    model, batch = em.MODELS[name]()
    model = model.to(torch.bfloat16)
    batch = em.batch_to(batch, "cpu", torch.bfloat16)
    assert batch[1].dtype in (torch.long, torch.bfloat16)
    loss = em.train_step(model, batch)
    assert loss.dtype == torch.bfloat16 and math.isfinite(float(loss))


# ------------------------------------------------------------------------ the planted fault

def _block_outputs_and_softmax(model, batch):
    """Forward once; return each block's output and each attention softmax (input, output)."""
    outs, soft = [], []
    hooks = [b.register_forward_hook(lambda m, i, o: outs.append(o.detach()))
             for b in model.blocks]
    for blk in model.blocks:
        orig = blk.attn.softmax
        blk.attn.softmax = (lambda s, orig=orig: soft.append((s.detach(), orig(s))) or soft[-1][1])
    loss = model.loss(batch)
    for h in hooks:
        h.remove()
    for blk in model.blocks:
        del blk.attn.softmax
    return loss, outs, [(s, p.detach()) for s, p in soft]


@pytest.fixture(scope="module")
def clean_and_faulty():
    clean, batch = em.tiny_gpt(seed=0, dropout=0.0, n_layers=3)
    faulty, fbatch = em.tiny_gpt(seed=0, dropout=0.0, n_layers=3, faulty_softmax=True,
                                 faulty_layer=1)
    assert all(torch.equal(x, y) for x, y in zip(batch, fbatch))
    for v1, v2 in zip(clean.state_dict().values(), faulty.state_dict().values()):
        assert torch.equal(v1, v2)
    return clean, faulty, batch


def test_faulty_softmax_differs_only_from_the_faulty_layer_on(clean_and_faulty):
    clean, faulty, batch = clean_and_faulty
    lc, oc, sc = _block_outputs_and_softmax(clean, batch)
    lf, of, sf = _block_outputs_and_softmax(faulty, batch)
    # before the faulty layer: bit for bit identical, including the faulty softmax's input
    assert torch.equal(oc[0], of[0])
    assert torch.equal(sc[0][1], sf[0][1])
    assert torch.equal(sc[1][0], sf[1][0])
    # the faulty softmax itself: finite, and off by half-precision rounding (~1e-4 .. 1e-2)
    p_clean, p_faulty = sc[1][1], sf[1][1]
    assert torch.isfinite(p_faulty).all()
    assert p_faulty.dtype == torch.float32
    rel = float((p_faulty - p_clean).norm() / p_clean.norm())
    assert 1e-4 < rel < 1e-2, rel
    # everything downstream differs, by far more than float32 noise, and stays finite
    for c, f in zip(oc[1:], of[1:]):
        assert torch.isfinite(f).all()
        assert float((c - f).norm() / c.norm()) > 1e-6
    assert torch.isfinite(lf) and lf != lc


def test_faulty_gradients_differ_and_fault_can_be_removed(clean_and_faulty):
    clean, faulty, batch = clean_and_faulty
    grads = []
    for m in (clean, faulty):
        m.zero_grad(set_to_none=True)
        em.forward_step(m, batch)
        grads.append({k: p.grad.clone() for k, p in m.named_parameters()})
    gc, gf = grads
    assert all(torch.isfinite(g).all() for g in gf.values())
    # the last block's MLP is downstream of the fault in forward: its gradient differs
    assert not torch.equal(gc["blocks.2.fc.weight"], gf["blocks.2.fc.weight"])
    # the faulty attention's backward reaches the earlier layers' weights
    assert not torch.equal(gc["blocks.0.attn.qkv.weight"], gf["blocks.0.attn.qkv.weight"])
    em.set_faulty_softmax(faulty, None)
    try:
        assert torch.equal(clean.loss(batch), faulty.loss(batch))
    finally:
        em.set_faulty_softmax(faulty, 1)


def test_faulty_layer_out_of_range():
    with pytest.raises(ValueError, match="faulty_layer=5"):
        em.tiny_gpt(faulty_softmax=True, faulty_layer=5)


# ------------------------------------------------------------------------------- the demo

def test_demo_dumps_one_step_and_summarises(tmp_path, capsys):
    from pytest_ptdbg.cli import demo

    out = tmp_path / "report"
    assert demo.main(["--out", str(out), "--model", "mlp", "--summary-only"]) == 0
    text = capsys.readouterr().out
    rank0 = Path(records.rank_dir(str(out)))
    assert str(rank0) in text
    s = demo.summarize_dump(str(rank0))
    model, _ = em.mlp()
    n_params = len(list(model.parameters()))
    # 6 model APIs (3 linear, gelu, relu, cross_entropy), each with a backward record
    assert s.backward_apis == 6
    assert s.optimizer_apis == n_params  # SGD without foreach: one update per parameter
    assert s.forward_apis >= 6 + n_params
    assert s.npy_files == 0 and s.total_bytes > 0 and not s.bad_lines
    assert f"APIs backward:   {s.backward_apis}" in text
    # a second run into the same folder replaces the dump instead of mixing into it
    assert demo.main(["--out", str(out), "--model", "mlp", "--summary-only"]) == 0
    assert demo.summarize_dump(str(rank0)).tensor_records == s.tensor_records


def test_demo_summary_reports_a_truncated_line(tmp_path):
    from pytest_ptdbg.cli import demo

    assert demo.main(["--out", str(tmp_path), "--model", "mlp", "--summary-only"]) == 0
    rank0 = Path(records.rank_dir(str(tmp_path)))
    pkl = rank0 / "api_stack_dump.pkl"
    n_lines = len(pkl.read_text().splitlines())
    with open(pkl, "a") as fh:
        fh.write('["Functional_linear_9_forward_input.0", 0, [], "torch.fl')
    s = demo.summarize_dump(str(rank0))
    assert s.bad_lines == [n_lines + 1]
    assert "unreadable lines" in s.text()


def test_demo_bad_model_is_a_clear_error(tmp_path, capsys):
    from pytest_ptdbg.cli import demo

    with pytest.raises(SystemExit):
        demo.main(["--out", str(tmp_path), "--model", "resnet"])
    assert "invalid choice: 'resnet'" in capsys.readouterr().err
