"""Architectures of the diagnosis benchmark: deterministic tiny models, batches and one training step.

Every architecture is ``Arch(name, build, loss)``: ``build()`` returns ``(model, batch)`` made from
seed 0 alone (the caller's RNG state is left alone), ``loss(model, batch)`` the scalar training
loss. The example models come from ``example_models``; the ``transformers`` ones (GPT-2, Llama,
BERT, ViT, T5) are built from tiny configs with random weights (never downloaded) and are left out,
with a note, when ``transformers`` does not import.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

import example_models as em

__all__ = ["Arch", "ARCHS", "available_archs", "skipped_note", "train_step", "fresh"]


@dataclass(frozen=True)
class Arch:
    """One architecture: a name, a deterministic builder and its loss."""

    name: str
    build: Callable[[], Tuple[nn.Module, Any]]
    loss: Callable[[nn.Module, Any], torch.Tensor]
    needs_transformers: bool = False


def _seeded(fn: Callable[[], Any], seed: int = 0) -> Any:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return fn()


def _example_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    return model.loss(batch)


class LogSoftmaxMLP(nn.Module):
    """Linear -> SiLU -> Linear, ``log_softmax`` + ``nll_loss`` (log-softmax and NLL visible)."""

    def __init__(self, d_in: int = 32, hidden: int = 64, n_classes: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(self.fc2(F.silu(self.fc1(x))), dim=-1)


class EmptyBufferMLP(nn.Module):
    """An MLP whose hidden layer is written into a ``torch.empty`` buffer (uninitialised memory)."""

    def __init__(self, d_in: int = 32, hidden: int = 64, n_classes: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        buf = torch.empty(x.shape[0], self.fc1.out_features, dtype=x.dtype)
        with torch.no_grad():
            buf.copy_(torch.tanh(self.fc1(x)))  # a scratch value, not part of the graph
        h = F.relu(self.fc1(x)) + 0.0 * buf.sum()
        return self.fc2(h)


def _mlp_nll() -> Tuple[nn.Module, Any]:
    def make():
        m = LogSoftmaxMLP()
        g = torch.Generator().manual_seed(11)
        return m, (torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g))
    return _seeded(make)


def _empty_mlp() -> Tuple[nn.Module, Any]:
    def make():
        m = EmptyBufferMLP()
        g = torch.Generator().manual_seed(12)
        return m, (torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g))
    return _seeded(make)


def _nll_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    return F.nll_loss(model(batch[0]), batch[1])


def _ce_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    return F.cross_entropy(model(batch[0]), batch[1])


# ------------------------------------------------------------------------------ transformers

VOCAB, SEQ, BATCH, HIDDEN, LAYERS, HEADS = 128, 16, 2, 64, 2, 4


def _ids(seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(seed))


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     bos_token_id=0, eos_token_id=0)
    cfg._attn_implementation = "eager"
    return _seeded(lambda: GPT2LMHeadModel(cfg)), {"input_ids": _ids(21), "labels": _ids(21)}


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128,
                      num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=2,
                      max_position_embeddings=32)
    cfg._attn_implementation = "sdpa"
    return _seeded(lambda: LlamaForCausalLM(cfg)), {"input_ids": _ids(22), "labels": _ids(22)}


def _bert():
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                     num_attention_heads=HEADS, intermediate_size=128, max_position_embeddings=32,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    cfg._attn_implementation = "eager"
    return _seeded(lambda: BertForMaskedLM(cfg)), {"input_ids": _ids(23), "labels": _ids(23)}


def _vit():
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=HIDDEN,
                    num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=128,
                    num_labels=10, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    cfg._attn_implementation = "sdpa"
    g = torch.Generator().manual_seed(24)
    batch = {"pixel_values": torch.randn(BATCH, 3, 16, 16, generator=g),
             "labels": torch.randint(0, 10, (BATCH,), generator=g)}
    return _seeded(lambda: ViTForImageClassification(cfg)), batch


def _t5():
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(vocab_size=VOCAB, d_model=HIDDEN, d_kv=16, d_ff=128, num_layers=LAYERS,
                   num_decoder_layers=LAYERS, num_heads=HEADS, dropout_rate=0.0,
                   decoder_start_token_id=0, pad_token_id=0)
    cfg._attn_implementation = "eager"
    return _seeded(lambda: T5ForConditionalGeneration(cfg)), {"input_ids": _ids(25), "labels": _ids(26)}


def _hf_loss(model: nn.Module, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
    return model(**batch).loss


ARCHS: Dict[str, Arch] = {a.name: a for a in [
    Arch("mlp", lambda: em.mlp(0), _example_loss),
    Arch("cnn", lambda: em.cnn(0), _example_loss),
    Arch("tiny_gpt", lambda: em.tiny_gpt(0, batch_size=2), _example_loss),
    Arch("mlp_nll", _mlp_nll, _nll_loss),
    Arch("empty_mlp", _empty_mlp, _ce_loss),
    # the benchmarks' nn.TransformerEncoder (d_model 256, 4 layers, batch 8 x 128; no fault planted on it)
    Arch("transformer", lambda: em.bench_transformer(0), _example_loss),
    Arch("gpt2", _gpt2, _hf_loss, True),
    Arch("llama", _llama, _hf_loss, True),
    Arch("bert", _bert, _hf_loss, True),
    Arch("vit", _vit, _hf_loss, True),
    Arch("t5", _t5, _hf_loss, True),
]}


def _have_transformers() -> bool:
    try:
        import transformers
    except Exception:
        return False
    transformers.logging.set_verbosity_error()
    return True


def available_archs() -> List[str]:
    """Names of the architectures this environment can build."""
    ok = _have_transformers()
    return [n for n, a in ARCHS.items() if ok or not a.needs_transformers]


def skipped_note() -> Optional[str]:
    """A note naming what is left out, or None."""
    if _have_transformers():
        return None
    return "transformers is not importable: GPT-2, Llama, BERT, ViT and T5 cases are skipped"


_CACHE: Dict[str, Tuple[nn.Module, Any]] = {}


def fresh(name: str) -> Tuple[nn.Module, Any]:
    """A new copy of architecture ``name``'s model and batch (built once, then deep-copied)."""
    if name not in _CACHE:
        _CACHE[name] = ARCHS[name].build()
    return copy.deepcopy(_CACHE[name])


def train_step(model: nn.Module, batch: Any, loss_fn: Callable[[nn.Module, Any], torch.Tensor],
               autocast: Optional[torch.dtype] = None, optimizer: str = "") -> torch.Tensor:
    """Forward and loss (under CPU autocast to ``autocast`` when given), backward, one AdamW step
    (``optimizer``: ``""`` one call per parameter and operation, ``"fused"`` or ``"foreach"``)."""
    model.train()
    kw = {"fused": True} if optimizer == "fused" else {"foreach": optimizer == "foreach"}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3, **kw)
    opt.zero_grad(set_to_none=True)
    if autocast is not None:
        with torch.autocast("cpu", dtype=autocast):
            loss = loss_fn(model, batch)
    else:
        loss = loss_fn(model, batch)
    loss.backward()
    opt.step()
    return loss.detach()
