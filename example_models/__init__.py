"""Small real PyTorch models for precision tests, examples and benchmarks (CPU, < 1 s a step).

``model, batch = tiny_gpt(seed=0)``; ``loss = train_step(model, batch)`` runs forward, loss,
backward and one optimizer step. See :mod:`example_models.models` for details.
"""
from example_models.models import (  # noqa: F401
    CNN, MLP, MODELS, BenchMLP, BenchTransformer, CausalSelfAttention, LSTMClassifier, TinyGPT,
    batch_to, bench_mlp, bench_transformer, cnn, forward_step, lstm, make_optimizer, mlp,
    set_faulty_softmax, tiny_gpt, train_step,
)

__all__ = [
    "MLP", "CNN", "TinyGPT", "CausalSelfAttention", "LSTMClassifier", "BenchMLP",
    "BenchTransformer", "mlp", "cnn", "tiny_gpt", "lstm", "bench_mlp", "bench_transformer",
    "train_step", "forward_step", "make_optimizer", "batch_to", "set_faulty_softmax", "MODELS",
]
