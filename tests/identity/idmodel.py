"""The identity suite's model: a 2-block pre-LN attention model whose every call site can be
spelled another way (issue 20: "a call is what it computes, not how it was spelled").

``make(variant)`` builds the model and batch from seed 0 alone (CPU, float32); ``variant`` is
``""`` (the original spelling), one of :data:`REFACTORS` (the same numbers, spelled otherwise: bit
for bit, or reordering rounding only) or one of :data:`REGRESSIONS` (a real change of what one call
computes, in block 0). Every variant has the same parameters, registered in the same order, so
the optimizer's calls are the same. ``train_step`` is forward, loss, backward and one SGD step.

The original spelling, per block::

    a = self.ln1(x)                                            # nn.LayerNorm
    q, k, v = self.q(a), self.k(a), self.v_lin(a)                  # nn.Linear
    q = q.view(B, T, H, dh); k = k.view(B, T, H, dh); v = v.view(B, T, H, dh)
    q, k, v = (t.transpose(1, 2).reshape(B * H, T, dh) for t in (q, k, v))
    s = torch.mul(q @ k.transpose(1, 2), scale)                # (B*H, T, T): a 3-d tensor
    p = F.softmax(s, dim=-1)
    o = (p @ v).view(B, H, T, dh)
    o = torch.cat([o[:, i] for i in range(H)], dim=-1)         # heads merged
    x = x + self.proj(o)
    m = self.fc2(F.gelu(self.fc1(self.ln2(x))))
    x = x + m

and the loss ``torch.div(self.head(self.ln_f(x)).pow(2).sum(), n)``.
"""
from __future__ import annotations

import math
from typing import Any, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["REFACTORS", "REGRESSIONS", "VARIANTS", "IdentityNet", "make", "train_step",
           "B", "T", "D", "H"]

B, T, D, H = 2, 6, 16, 2
DH = D // H

#: pure refactors: the same computation spelled otherwise (bit-identical, or rounding reordered)
REFACTORS = [
    "ln_functional_positional",   # nn.LayerNorm -> F.layer_norm(x, (D,), w, b, 1e-5) in the block
    "ln_functional_keywords",     # -> F.layer_norm(x, (D,), weight=w, bias=b, eps=1e-5)
    "ln_all_keywords",            # -> F.layer_norm(input=x, normalized_shape=[D], weight=w, bias=b)
    "gelu_approximate_none",      # F.gelu(h) -> F.gelu(h, approximate="none")
    "softmax_dim2",               # F.softmax(s, dim=-1) -> F.softmax(s, dim=2) (s is 3-d)
    "softmax_torch",              # -> torch.softmax(s, -1)
    "softmax_method",             # -> s.softmax(-1)
    "add_torch",                  # x + a -> torch.add(x, a)
    "add_method",                 # -> x.add(a)
    "add_swapped",                # -> a + x
    "matmul_torch",               # a @ b -> torch.matmul(a, b)
    "linear_functional",          # nn.Linear -> F.linear(h, w, b) in the block
    "alias_multiply",             # torch.mul -> torch.multiply
    "alias_divide",               # torch.div -> torch.divide
    "alias_concat",               # torch.cat -> torch.concat
    "qk_views_swapped",           # k's view before q's (two independent same-shape calls)
    "all_keywords",               # every argument the original passes positionally, by keyword
                                  # (the same APIs: x + a -> x.add(other=a), a @ b -> a.matmul(other=b))
]

#: regressions, each in block 0 only: what one call computes changes
REGRESSIONS = [
    "reg_ln_eps",                 # ln1's eps 1e-5 -> 1e-3
    "reg_softmax_fp16_nomax",     # softmax as exp(s) / sum(exp(s)) in float16, no max subtraction
    "reg_bf16_roundtrip",         # h.to(torch.bfloat16).to(torch.float32) after ln2
    "reg_gelu_tanh",              # F.gelu(h, approximate="tanh")
    "reg_scale_1001",             # the GELU's output scaled by 1.001
]

VARIANTS = [""] + REFACTORS + REGRESSIONS


class KeywordLayerNorm(nn.LayerNorm):
    """nn.LayerNorm whose forward passes every argument of F.layer_norm by keyword (eps omitted:
    the default 1e-5); same parameters, same module path."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 (nn.Module's name)
        return F.layer_norm(input=input, normalized_shape=list(self.normalized_shape),
                            weight=self.weight, bias=self.bias)


class Block(nn.Module):
    def __init__(self, variant: str, first: bool) -> None:
        super().__init__()
        v = variant
        ln = KeywordLayerNorm if v in ("ln_all_keywords", "all_keywords") else nn.LayerNorm
        self.spelling = v
        self.bad = v if first else ""     # regressions are planted in block 0 only
        self.ln1 = ln(D, eps=1e-3 if self.bad == "reg_ln_eps" else 1e-5)
        self.q, self.k, self.v_lin = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)
        self.proj = nn.Linear(D, D)
        self.ln2 = ln(D)
        self.fc1, self.fc2 = nn.Linear(D, 2 * D), nn.Linear(2 * D, D)
        self.scale = 1.0 / math.sqrt(DH)

    # ------------------------------------------------------------------ spellings of one call
    def _ln(self, mod: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
        if self.spelling == "ln_functional_positional":
            return F.layer_norm(x, (D,), mod.weight, mod.bias, 1e-5)
        if self.spelling == "ln_functional_keywords":
            return F.layer_norm(x, (D,), weight=mod.weight, bias=mod.bias, eps=1e-5)
        return mod(x)

    def _linear(self, mod: nn.Linear, h: torch.Tensor) -> torch.Tensor:
        if self.spelling == "linear_functional":
            return F.linear(h, mod.weight, mod.bias)
        if self.spelling == "all_keywords":
            return F.linear(input=h, weight=mod.weight, bias=mod.bias)
        return mod(h)

    def _add(self, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        if self.spelling == "add_torch":
            return torch.add(x, a)
        if self.spelling == "add_method":
            return x.add(a)
        if self.spelling == "add_swapped":
            return a + x
        if self.spelling == "all_keywords":
            return x.add(other=a)
        return x + a

    def _matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if self.spelling == "matmul_torch":
            return torch.matmul(a, b)
        if self.spelling == "all_keywords":
            return a.matmul(other=b)
        return a @ b

    def _softmax(self, s: torch.Tensor) -> torch.Tensor:
        if self.bad == "reg_softmax_fp16_nomax":
            e = s.to(torch.float16).exp()
            return (e / e.sum(-1, keepdim=True)).to(torch.float32)
        if self.spelling == "softmax_dim2":
            return F.softmax(s, dim=2)
        if self.spelling == "softmax_torch":
            return torch.softmax(s, -1)
        if self.spelling == "softmax_method":
            return s.softmax(-1)
        if self.spelling == "all_keywords":
            return F.softmax(input=s, dim=-1)
        return F.softmax(s, dim=-1)

    def _gelu(self, h: torch.Tensor) -> torch.Tensor:
        if self.bad == "reg_gelu_tanh":
            return F.gelu(h, approximate="tanh")
        if self.spelling == "gelu_approximate_none":
            return F.gelu(h, approximate="none")
        if self.spelling == "all_keywords":
            return F.gelu(input=h, approximate="none")
        return F.gelu(h)

    def _mul(self, s: torch.Tensor) -> torch.Tensor:
        if self.spelling == "alias_multiply":
            return torch.multiply(s, self.scale)
        if self.spelling == "all_keywords":
            return torch.mul(input=s, other=self.scale)
        return torch.mul(s, self.scale)

    def _cat(self, parts: list) -> torch.Tensor:
        if self.spelling == "alias_concat":
            return torch.concat(parts, dim=-1)
        if self.spelling == "all_keywords":
            return torch.cat(tensors=parts, dim=-1)
        return torch.cat(parts, dim=-1)

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        if self.spelling == "all_keywords":
            return t.transpose(dim0=1, dim1=2).reshape(shape=(B * H, T, DH))
        return t.transpose(1, 2).reshape(B * H, T, DH)

    # ------------------------------------------------------------------------------ forward
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self._ln(self.ln1, x)
        ql, kl, vl = self._linear(self.q, a), self._linear(self.k, a), self._linear(self.v_lin, a)
        if self.spelling == "qk_views_swapped":
            k = kl.view(B, T, H, DH)
            q = ql.view(B, T, H, DH)
        elif self.spelling == "all_keywords":
            q = ql.view(size=(B, T, H, DH))
            k = kl.view(size=(B, T, H, DH))
        else:
            q = ql.view(B, T, H, DH)
            k = kl.view(B, T, H, DH)
        v = vl.view(size=(B, T, H, DH)) if self.spelling == "all_keywords" else vl.view(B, T, H, DH)
        q, k, v = self._heads(q), self._heads(k), self._heads(v)
        kt = k.transpose(dim0=1, dim1=2) if self.spelling == "all_keywords" else k.transpose(1, 2)
        s = self._mul(self._matmul(q, kt))                      # (B*H, T, T)
        p = self._softmax(s)
        o = self._matmul(p, v)
        o = o.view(size=(B, H, T, DH)) if self.spelling == "all_keywords" else o.view(B, H, T, DH)
        o = self._cat([o[:, i] for i in range(H)])              # (B, T, D)
        x = self._add(x, self._linear(self.proj, o))
        h = self._ln(self.ln2, x)
        if self.bad == "reg_bf16_roundtrip":
            h = h.to(torch.bfloat16).to(torch.float32)
        h = self._gelu(self._linear(self.fc1, h))
        if self.bad == "reg_scale_1001":
            h = h * 1.001
        return self._add(x, self._linear(self.fc2, h))


class IdentityNet(nn.Module):
    def __init__(self, variant: str = "") -> None:
        super().__init__()
        if variant not in VARIANTS:
            raise ValueError(f"unknown variant {variant!r}")
        self.variant = variant
        self.blocks = nn.ModuleList([Block(variant, i == 0) for i in range(2)])
        self.ln_f = nn.LayerNorm(D)
        self.head = nn.Linear(D, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks:
            x = blk(x)
        y = self.head(self.ln_f(x))
        total = y.pow(2).sum()
        if self.variant == "alias_divide":
            return torch.divide(total, y.numel())
        if self.variant == "all_keywords":
            return torch.div(input=total, other=y.numel())
        return torch.div(total, y.numel())


def make(variant: str = "") -> Tuple[IdentityNet, Tuple[torch.Tensor]]:
    """The model in ``variant``'s spelling and its batch, from seed 0 alone (the caller's RNG
    state is left as it was): every variant has the same weights and the same input."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = IdentityNet(variant)
    x = torch.randn(B, T, D, generator=torch.Generator().manual_seed(1))
    return model, (x,)


def train_step(model: nn.Module, batch: Any) -> torch.Tensor:
    """Forward, loss, backward and one SGD step."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(*batch)
    loss.backward()
    opt.step()
    return loss.detach()
