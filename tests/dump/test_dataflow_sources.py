"""The dataflow of a dump (issue 20): each forward call's inputs name the recorded call and output
slot that produced them (the call spec's optional ``"src"``, ``ApiRec.sources``). Real steps."""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

import example_models as em  # noqa: E402
from real_dumps import dump_user_step  # noqa: E402
from pytest_ptdbg import PrecisionDebugger  # noqa: E402
from pytest_ptdbg.dump.reader import read_dump  # noqa: E402
from pytest_ptdbg.plugin.golden_check import golden_lines  # noqa: E402


def _mlp_step():
    m, (x, y) = em.mlp(seed=0, batch_size=4)
    return m, x, y


def test_sources_name_the_producer_and_its_output_slot(tmp_path):
    m, x, y = _mlp_step()

    def step():
        h = m.fc1(x)
        a, b = h.chunk(2, dim=1)            # a tuple output: output.0 and output.1
        z = torch.cat([b, a], dim=1)        # a list input: input.0.0 and input.0.1
        out = m.fc3(torch.relu(m.fc2(torch.nn.functional.gelu(z))))
        torch.nn.functional.cross_entropy(out, y).backward()

    d = dump_user_step(tmp_path / "d", step)
    apis = {a.key: a for a in read_dump(d.pkl).apis}
    src = {k: a.sources for k, a in apis.items() if a.direction == "forward"}
    assert src["Functional_linear_0_forward"] == {}   # x and the weights come from no recorded call
    assert src["Tensor_chunk_0_forward"] == {"input.0": ("Functional_linear_0_forward", "output.0")}
    assert src["Torch_cat_0_forward"] == {"input.0.0": ("Tensor_chunk_0_forward", "output.1"),
                                          "input.0.1": ("Tensor_chunk_0_forward", "output.0")}
    assert src["Functional_gelu_0_forward"] == {"input.0": ("Torch_cat_0_forward", "output.0")}
    assert src["Functional_linear_1_forward"] == {"input.0": ("Functional_gelu_0_forward", "output.0")}
    assert src["Torch_relu_0_forward"] == {"input.0": ("Functional_linear_1_forward", "output.0")}
    assert src["Functional_cross_entropy_0_forward"] == {"input.0": ("Functional_linear_2_forward", "output.0")}
    assert all(not a.sources for a in apis.values() if a.direction == "backward")
    # not an argument: the golden of a dump carries no dataflow
    lines = golden_lines(d.pkl, {}).lines
    assert all("src" not in (ln.get("args") or {}) and "src" not in ln for ln in lines)
    assert any(ln.get("args") for ln in lines)


def _train(debug_dir=None):
    torch.manual_seed(0)
    m, batch = em.tiny_gpt(seed=0)
    dbg = None
    if debug_dir is not None:
        dbg = PrecisionDebugger(dump_path=str(debug_dir), hook_name="dump", step=[0])
        dbg.configure_hook(mode="api_stack")
        dbg.start()
    loss = em.train_step(m, batch)   # forward (its dropout), backward, AdamW
    if dbg is not None:
        dbg.stop()
        dbg.close()
    return loss.clone(), [p.detach().clone() for p in m.parameters()]


def test_numbers_are_bit_identical_with_and_without_the_debugger(tmp_path):
    plain_loss, plain = _train()
    loss, params = _train(tmp_path / "d")
    assert torch.equal(plain_loss, loss)
    assert len(plain) == len(params) and all(torch.equal(a, b) for a, b in zip(plain, params))
    assert any(a.sources for a in read_dump(str(tmp_path / "d")).apis)


@pytest.mark.parametrize("bad", ["not a dict", {"input.0": "Functional_linear_0_forward.output.0"},
                                 {"output.0": ["Functional_linear_0_forward", "output.0"]},
                                 {"input.0": ["Functional_linear_0_forward", "input.0"]}, [1, 2]])
def test_a_malformed_dataflow_is_ignored_and_noted(tmp_path, bad):
    m, x, y = _mlp_step()
    d = dump_user_step(tmp_path / "d", lambda: em.train_step(m, (x, y)))
    with open(d.pkl) as f:
        recs = [json.loads(line) for line in f]
    hit = None
    for rec in recs:
        call = rec[6].get("call") if len(rec) > 6 and isinstance(rec[6], dict) else None
        if isinstance(call, dict) and "src" in call:
            call["src"] = bad
            hit = rec[0]
            break
    assert hit is not None
    with open(d.pkl, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs)
    dump = read_dump(d.pkl)
    assert not dump.problems   # a hint for pairing only: nothing unusable
    assert any("dataflow" in n and "ignored" in n for n in dump.notes), dump.notes
    api = next(a for a in dump.apis if hit.startswith(a.key))
    assert api.sources == {}
    assert sum(1 for a in dump.apis if a.sources) > 0
