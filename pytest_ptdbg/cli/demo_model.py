"""The demo's model, shipped in the package (``ptdbg demo`` works from a normal install): a tiny
GPT (token and position embedding, pre-norm causal attention blocks, tied head) and one training
step with AdamW. ``example_models/`` in the repository is the user-facing example suite; this is
only what the demo dumps.
"""
from __future__ import annotations

import math
from typing import Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    """Multi-head causal self-attention."""

    mask: torch.Tensor  # a buffer (register_buffer)

    def __init__(self, d_model: int, n_heads: int, block_size: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.register_buffer("mask", torch.ones(block_size, block_size, dtype=torch.bool).triu(1),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        h = self.n_heads
        q, k, v = (t.view(B, T, h, C // h).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(C // h)
        att = F.softmax(scores.masked_fill(self.mask[:T, :T], float("-inf")), dim=-1)
        return self.proj((att @ v).transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int, block_size: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = Attention(d_model, n_heads, block_size)
        self.fc, self.out = nn.Linear(d_model, 4 * d_model), nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    """``model(tokens, targets)`` returns the cross-entropy loss."""

    optimizer = "adamw"

    def __init__(self, vocab: int = 64, block_size: int = 16, d_model: int = 32,
                 n_heads: int = 2, n_layers: int = 2) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(block_size, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, block_size) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return F.cross_entropy(self.head(self.ln_f(x)).flatten(0, 1), target.flatten())


class MLP(nn.Module):
    """``model(x, target)``: Linear -> GELU -> Linear -> ReLU -> Linear, cross-entropy loss."""

    optimizer = "sgd"

    def __init__(self, d_in: int = 32, hidden: int = 64, classes: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc2(F.gelu(self.fc1(x))))
        return F.cross_entropy(self.fc3(h), target)


def build(name: str, seed: int = 0) -> Tuple[nn.Module, tuple]:
    """``(model, batch)`` of the demo model ``name`` (``tiny_gpt`` or ``mlp``), from ``seed``
    alone; the caller's RNG state is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        gen = torch.Generator().manual_seed(seed + 1)
        if name == "tiny_gpt":
            model: nn.Module = TinyGPT()
            seq = torch.randint(0, 64, (4, 17), generator=gen)
            return model, (seq[:, :-1].contiguous(), seq[:, 1:].contiguous())
        if name == "mlp":
            model = MLP()
            return model, (torch.randn(16, 32, generator=gen),
                           torch.randint(0, 10, (16,), generator=gen))
    raise ValueError(f"model={name!r}: expected one of {', '.join(MODELS)}")


MODELS = ("tiny_gpt", "mlp")


def train_step(model: nn.Module, batch: tuple) -> torch.Tensor:
    """Forward, backward and one optimizer step (AdamW for the GPT, SGD for the MLP; one
    update call per parameter); returns the detached loss."""
    if getattr(model, "optimizer", "sgd") == "adamw":
        opt: torch.optim.Optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, foreach=False)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)
    opt.zero_grad(set_to_none=True)
    loss = model(*batch)
    loss.backward()
    opt.step()
    return loss.detach()
