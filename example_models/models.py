"""Small real PyTorch models for precision tests, examples and benchmarks.

Every factory ``f(seed=0, ...)`` returns ``(model, batch)``: the model's weights and the batch
are built from ``seed`` alone (the caller's global RNG state is left untouched), ``batch`` is a
tuple of tensors, ``model(*batch)`` returns the scalar training loss (``model(batch[0])`` the
raw output), and ``model.loss(batch)`` is the same loss. ``train_step`` does forward, loss,
backward and one optimizer step with the optimizer the model names (``model.optimizer_name``).

Dropout (``tiny_gpt``, ``bench_transformer``) draws from the global RNG: seed it
(``torch.manual_seed`` / ``pytest_ptdbg.seed_all``) before a step to make the step repeatable.
"""
from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Iterator, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

Batch = Tuple[torch.Tensor, ...]

__all__ = [
    "MLP", "CNN", "TinyGPT", "CausalSelfAttention", "LSTMClassifier", "BenchMLP",
    "BenchTransformer", "mlp", "cnn", "tiny_gpt", "lstm", "bench_mlp", "bench_transformer",
    "train_step", "forward_step", "make_optimizer", "batch_to", "set_faulty_softmax",
    "MODELS",
]


class _Seeded:
    """Context manager: seed torch's CPU RNG for model construction, restore it afterwards."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._fork: Optional[Any] = None

    def __enter__(self) -> torch.Generator:
        self._fork = torch.random.fork_rng(devices=[])
        self._fork.__enter__()
        torch.manual_seed(self.seed)
        gen = torch.Generator().manual_seed(self.seed + 7919)
        return gen

    def __exit__(self, *exc: Any) -> None:
        assert self._fork is not None
        self._fork.__exit__(*exc)


class _LossModel(nn.Module):
    """Base: ``forward(x, target=None)`` returns the output, or the loss when a target is given."""

    optimizer_name = "sgd"
    default_lr = 0.1

    def output(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def criterion(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out, target)

    def forward(self, x: torch.Tensor, target: Optional[torch.Tensor] = None) -> torch.Tensor:
        out = self.output(x)
        if target is None:
            return out
        return self.criterion(out, target)

    def loss(self, batch: Sequence[torch.Tensor]) -> torch.Tensor:
        """The scalar training loss on ``batch`` (``(inputs, targets)``)."""
        return self(*batch)


# --------------------------------------------------------------------------------------- MLP

class MLP(_LossModel):
    """Linear -> GELU -> Linear -> ReLU -> Linear classifier."""

    def __init__(self, d_in: int = 32, hidden: int = 64, n_classes: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, n_classes)

    def output(self, x: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)


def mlp(seed: int = 0, batch_size: int = 16, d_in: int = 32, hidden: int = 64,
        n_classes: int = 10) -> Tuple[MLP, Batch]:
    """A 3-layer MLP classifier and a batch ``(x [B, d_in], labels [B])``; SGD."""
    with _Seeded(seed) as gen:
        model = MLP(d_in, hidden, n_classes)
        x = torch.randn(batch_size, d_in, generator=gen)
        y = torch.randint(0, n_classes, (batch_size,), generator=gen)
    return model, (x, y)


# --------------------------------------------------------------------------------------- CNN

class CNN(_LossModel):
    """Two conv -> BatchNorm -> ReLU blocks, max/avg pooling, linear head."""

    def __init__(self, channels: int = 3, n_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.head = nn.Linear(16, n_classes)

    def output(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.relu(self.bn2(self.conv2(x)))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.head(x)


def cnn(seed: int = 0, batch_size: int = 8, image_size: int = 16,
        n_classes: int = 10) -> Tuple[CNN, Batch]:
    """A small CNN with BatchNorm and a batch ``(images [B,3,H,W], labels [B])``; SGD."""
    with _Seeded(seed) as gen:
        model = CNN(3, n_classes)
        x = torch.randn(batch_size, 3, image_size, image_size, generator=gen)
        y = torch.randint(0, n_classes, (batch_size,), generator=gen)
    return model, (x, y)


# ---------------------------------------------------------------------------------- tiny GPT

class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention written out API by API.

    ``softmax_dtype`` is the dtype the softmax is computed in: ``None`` (clean) is float32; a
    reduced dtype (the planted fault, e.g. ``torch.float16``) computes ``exp(s) / sum(exp(s))``
    in that dtype without max subtraction, a real precision bug. Both paths make the same
    sequence of API calls (to, exp, sum, div, to), so a clean and a faulty run pair one to one.
    """

    def __init__(self, d_model: int, n_heads: int, block_size: int, dropout: float) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.attn_drop = nn.Dropout(dropout)
        self.resid_drop = nn.Dropout(dropout)
        self.softmax_dtype: Optional[torch.dtype] = None
        mask = torch.ones(block_size, block_size, dtype=torch.bool).triu(1)
        self.register_buffer("causal_mask", mask, persistent=False)

    def softmax(self, scores: torch.Tensor) -> torch.Tensor:
        """Row softmax ``exp(s) / sum(exp(s))`` of ``scores`` computed in ``softmax_dtype``.

        Clean (``softmax_dtype=None``): float32; no max subtraction is needed there because the
        scores of this small model stay far below float32's exp overflow (88). Faulty (e.g.
        ``torch.float16``): the same formula in half precision, where the missing max
        subtraction and the 11-bit mantissa lose precision (and overflow above 11.09).
        """
        s = scores.to(self.softmax_dtype or torch.float32)
        e = s.exp()
        p = e / e.sum(-1, keepdim=True)
        return p.to(scores.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        h = self.n_heads
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, h, C // h).transpose(1, 2)
        k = k.view(B, T, h, C // h).transpose(1, 2)
        v = v.view(B, T, h, C // h).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // h))
        scores = scores.masked_fill(self.causal_mask[:T, :T], float("-inf"))
        att = self.attn_drop(self.softmax(scores))
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        return self.resid_drop(self.proj(y))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), x + mlp(ln(x))."""

    def __init__(self, d_model: int, n_heads: int, block_size: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads, block_size, dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.fc_out = nn.Linear(4 * d_model, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.drop(self.fc_out(F.gelu(self.fc(self.ln2(x)))))


class TinyGPT(_LossModel):
    """GPT-style language model: token + position embedding, causal blocks, final norm, head."""

    optimizer_name = "adamw"
    default_lr = 3e-3

    def __init__(self, vocab_size: int = 64, block_size: int = 16, d_model: int = 32,
                 n_heads: int = 2, n_layers: int = 2, dropout: float = 0.1,
                 tie_weights: bool = True) -> None:
        super().__init__()
        self.block_size = block_size
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(block_size, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            Block(d_model, n_heads, block_size, dropout) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        if tie_weights:
            self.head.weight = self.tok_emb.weight
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.2)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def output(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        if T > self.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def criterion(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out.flatten(0, 1), target.flatten())


def set_faulty_softmax(model: TinyGPT, layer: Optional[int] = 1,
                       dtype: torch.dtype = torch.float16) -> TinyGPT:
    """Plant (``layer`` an int) or remove (``layer=None``) the half-precision softmax fault."""
    for i, block in enumerate(model.blocks):
        block.attn.softmax_dtype = dtype if i == layer else None
    return model


def tiny_gpt(seed: int = 0, batch_size: int = 4, seq_len: int = 16, vocab_size: int = 64,
             d_model: int = 32, n_heads: int = 2, n_layers: int = 2, dropout: float = 0.1,
             tie_weights: bool = True, faulty_softmax: bool = False, faulty_layer: int = 1,
             fault_dtype: torch.dtype = torch.float16) -> Tuple[TinyGPT, Batch]:
    """A tiny GPT and a batch ``(tokens [B,T], next tokens [B,T])``; AdamW.

    ``faulty_softmax=True`` plants the precision fault in attention layer ``faulty_layer`` only
    (softmax in ``fault_dtype`` without max subtraction); the weights are the same as without it.
    Size of the fault (seed 0, fp32 bench): the faulty softmax output is off by ~3e-4 relative
    L2 (max abs ~5e-4, cosine ~1 - 1e-7), the layers before it are bit-identical. That is far
    above float32 noise but inside ptdbg's default rule (cosine >= 0.99 or MaxAbsErr <= 1e-3):
    a dtype-aware rule or the advisor's error growth is what catches it.
    """
    if faulty_softmax and not 0 <= faulty_layer < n_layers:
        raise ValueError(f"faulty_layer={faulty_layer} not in range(n_layers={n_layers})")
    with _Seeded(seed) as gen:
        model = TinyGPT(vocab_size, seq_len, d_model, n_heads, n_layers, dropout, tie_weights)
        seq = torch.randint(0, vocab_size, (batch_size, seq_len + 1), generator=gen)
    if faulty_softmax:
        set_faulty_softmax(model, faulty_layer, fault_dtype)
    return model, (seq[:, :-1].contiguous(), seq[:, 1:].contiguous())


# -------------------------------------------------------------------------------------- LSTM

class LSTMClassifier(_LossModel):
    """Single-layer LSTM over a sequence, linear head on the last hidden state."""

    def __init__(self, d_in: int = 8, hidden: int = 16, n_classes: int = 5) -> None:
        super().__init__()
        self.lstm = nn.LSTM(d_in, hidden, batch_first=True)
        self.head = nn.Linear(hidden, n_classes)

    def output(self, x: torch.Tensor) -> torch.Tensor:
        with _lstm_backend(x):
            out, _ = self.lstm(x)
        return self.head(out[:, -1])


def _lstm_backend(x: torch.Tensor) -> Any:
    """oneDNN's LSTM has no bf16 kernel on CPUs without bf16 instructions (some AMD EPYC): there
    PyTorch raises "could not create a primitive descriptor" under bf16 autocast. Use PyTorch's
    own LSTM kernel for bf16 on such CPUs; everything else keeps the default backend."""
    lower = x.dtype == torch.bfloat16 or (
        torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16)
    if x.device.type == "cpu" and lower and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return _without_onednn()
    return contextlib.nullcontext()


@contextlib.contextmanager
def _without_onednn() -> Iterator[None]:
    """oneDNN off for the block, its other flags as they were (no TF32 warning)."""
    m = torch.backends.mkldnn
    with m.flags(enabled=False, deterministic=m.deterministic, allow_tf32=m.allow_tf32):
        yield


def lstm(seed: int = 0, batch_size: int = 8, seq_len: int = 12, d_in: int = 8,
         hidden: int = 16, n_classes: int = 5) -> Tuple[LSTMClassifier, Batch]:
    """An LSTM sequence classifier and a batch ``(x [B,T,d_in], labels [B])``; SGD."""
    with _Seeded(seed) as gen:
        model = LSTMClassifier(d_in, hidden, n_classes)
        x = torch.randn(batch_size, seq_len, d_in, generator=gen)
        y = torch.randint(0, n_classes, (batch_size,), generator=gen)
    return model, (x, y)


# -------------------------------------------------------------------------------- benchmarks

class BenchMLP(_LossModel):
    """The benchmark MLP: 3 x Linear(512, 512) with ReLU between, cross entropy over 512."""

    default_lr = 0.01

    def __init__(self, width: int = 512) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(width, width), nn.ReLU(),
                                    nn.Linear(width, width), nn.ReLU(),
                                    nn.Linear(width, width))

    def output(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def bench_mlp(seed: int = 0, batch_size: int = 64, width: int = 512) -> Tuple[BenchMLP, Batch]:
    """Benchmark workload (a): 3 x Linear 512, batch 64, SGD."""
    with _Seeded(seed) as gen:
        model = BenchMLP(width)
        x = torch.randn(batch_size, width, generator=gen)
        y = torch.randint(0, width, (batch_size,), generator=gen)
    return model, (x, y)


class BenchTransformer(_LossModel):
    """The benchmark transformer: nn.TransformerEncoder (defaults: ReLU, FFN 2048, dropout 0.1)."""

    optimizer_name = "adamw"
    default_lr = 1e-4

    def __init__(self, d_model: int = 256, n_heads: int = 4, n_layers: int = 4) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(d_model, n_heads, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)

    def output(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)

    def criterion(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(out, target)


def bench_transformer(seed: int = 0, batch_size: int = 8, seq_len: int = 128,
                      d_model: int = 256, n_heads: int = 4,
                      n_layers: int = 4) -> Tuple[BenchTransformer, Batch]:
    """Benchmark workload (b): TransformerEncoder d256, 4 heads, 4 layers, batch 8, seq 128, AdamW."""
    with _Seeded(seed) as gen:
        model = BenchTransformer(d_model, n_heads, n_layers)
        x = torch.randn(batch_size, seq_len, d_model, generator=gen)
        y = torch.randn(batch_size, seq_len, d_model, generator=gen)
    return model, (x, y)


# ----------------------------------------------------------------------------------- steps

def make_optimizer(model: nn.Module, lr: Optional[float] = None,
                   optimizer: Optional[str] = None) -> torch.optim.Optimizer:
    """A fresh optimizer for ``model``: ``"sgd"`` or ``"adamw"`` (default: the model's choice).

    ``foreach=False`` on every device, so the update is one visible call per parameter.
    """
    name = (optimizer or getattr(model, "optimizer_name", "sgd")).lower()
    lr = float(lr if lr is not None else getattr(model, "default_lr", 0.01))
    params = [p for p in model.parameters() if p.requires_grad]
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, foreach=False)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, foreach=False)
    raise ValueError(f"optimizer={name!r}: expected 'sgd' or 'adamw'")


def _loss_of(model: nn.Module, batch: Any) -> torch.Tensor:
    if hasattr(model, "loss"):
        return model.loss(batch)
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def forward_step(model: nn.Module, batch: Any) -> torch.Tensor:
    """Forward and backward (no optimizer step); returns the detached loss."""
    model.train()
    loss = _loss_of(model, batch)
    loss.backward()
    return loss.detach()


def train_step(model: nn.Module, batch: Any, lr: Optional[float] = None,
               optimizer: Optional[str] = None) -> torch.Tensor:
    """One training step: zero grads, forward, loss, backward, one optimizer step.

    The optimizer (``"sgd"``/``"adamw"``, default the model's ``optimizer_name``) is created
    inside, so every call is a self-contained first step. Returns the detached loss.
    """
    opt = make_optimizer(model, lr, optimizer)
    opt.zero_grad(set_to_none=True)
    loss = forward_step(model, batch)
    opt.step()
    return loss


def batch_to(batch: Any, device: Any = None, dtype: Optional[torch.dtype] = None) -> Any:
    """Move a batch (tensor, tuple/list or dict of tensors) to ``device``; floating tensors to ``dtype``."""
    if isinstance(batch, torch.Tensor):
        if dtype is not None and batch.is_floating_point():
            return batch.to(device=device, dtype=dtype)
        return batch.to(device=device)
    if isinstance(batch, dict):
        return {k: batch_to(v, device, dtype) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(batch_to(v, device, dtype) for v in batch)
    return batch


#: name -> factory, for parametrised tests and the demo
MODELS: dict = {"mlp": mlp, "cnn": cnn, "tiny_gpt": tiny_gpt, "lstm": lstm}
