"""The one table of calls that are not judged by value, and how each is judged instead. No torch.

The judge (:mod:`.own_error`) replays every call from the device's recorded inputs and compares
its outputs with a float64 oracle. Some calls have no single right answer to compare with:

* ``UNINITIALISED``: ``empty*``, ``new_empty``: their values are whatever memory held;
* ``RANDOM``: random generators and in-place random fills: their values are draws;
* ``DROPOUT``: dropout is checked *structurally*: every output element is 0 or input / (1 - p)
  (backward: every produced gradient element is 0 or incoming / (1 - p)), never element by element
  against a replay, whose draws differ;
* ``RANDOM_WITH_P``: calls that are deterministic unless a probability argument is non-zero
  (``scaled_dot_product_attention(dropout_p=...)``): judged like any call when it is 0, else not
  judged (no recorded generator state);
* ``TIES``: results whose integer outputs are indices that are not unique when values tie
  (``argmax``, ``topk``, ``sort``, ``max(dim)``...): an index output is right when the value it
  points to equals the value the oracle's index points to; value outputs are judged as usual;
* ``DUPLICATES``: scatters without accumulation: when an index repeats along the scattered
  dimension, which write wins is not defined, so the call is not judged.

This is the only place where an API's name changes how it is judged; every call that is not
judged is counted and listed with its reason (:class:`.own_error.DumpJudgement.not_judged`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

from pytest_ptdbg.runtime.text import TextEnum

__all__ = ["Treatment", "Special", "special_of", "random_families", "probability_arg", "dim_arg"]


class Treatment(TextEnum):
    """How a call outside plain replay-and-compare is judged."""

    UNINITIALISED = "uninitialised memory"
    RANDOM = "random draws"
    DROPOUT = "dropout, checked structurally"
    RANDOM_WITH_P = "random when its probability argument is not 0"
    TIES = "indices not unique on ties"
    DUPLICATES = "not unique on repeated indices"


@dataclass(frozen=True)
class Special:
    """One row of the table: the treatment, and where its probability or dim argument is."""

    treatment: Treatment
    #: (position, keyword) of the probability (dropout p, sdpa dropout_p) or of the dim
    arg: Optional[tuple] = None
    default: Any = None


_U, _R, _D, _P, _T, _S = (Treatment.UNINITIALISED, Treatment.RANDOM, Treatment.DROPOUT,
                          Treatment.RANDOM_WITH_P, Treatment.TIES, Treatment.DUPLICATES)

#: API family -> treatment. Families as dumps name them (``{Type}_{name}``).
TABLE: Dict[str, Special] = {
    # not a computation: uninitialised memory
    **{f"Torch_{n}": Special(_U) for n in ("empty", "empty_like", "empty_strided", "empty_permuted")},
    "Tensor_new_empty": Special(_U), "Tensor_new_empty_strided": Special(_U),
    # random generators
    **{f"Torch_{n}": Special(_R) for n in ("rand", "rand_like", "randn", "randn_like", "randint",
                                          "randint_like", "randperm", "bernoulli", "multinomial",
                                          "normal", "poisson", "rrelu", "rrelu_")},
    **{f"Tensor_{n}": Special(_R) for n in ("uniform_", "normal_", "random_", "bernoulli",
                                           "bernoulli_", "exponential_", "geometric_", "cauchy_",
                                           "log_normal_", "multinomial")},
    **{f"Functional_{n}": Special(_R) for n in ("rrelu", "rrelu_", "gumbel_softmax")},
    "NN_init_uniform_": Special(_R), "NN_init_normal_": Special(_R),
    # dropout: structural check (p: 2nd argument or ``p``)
    **{f"Functional_{n}": Special(_D, (1, "p"), 0.5) for n in ("dropout", "dropout1d", "dropout2d",
                                                              "dropout3d", "feature_dropout")},
    **{f"Torch_{n}": Special(_D, (1, "p"), 0.5) for n in ("dropout", "dropout_", "feature_dropout")},
    **{f"Functional_{n}": Special(_R) for n in ("alpha_dropout", "feature_alpha_dropout")},
    "Torch_alpha_dropout": Special(_R), "Torch_feature_alpha_dropout": Special(_R),
    # deterministic unless a probability is given
    "Functional_scaled_dot_product_attention": Special(_P, (4, "dropout_p"), 0.0),
    "Torch_scaled_dot_product_attention": Special(_P, (4, "dropout_p"), 0.0),
    # nn.MultiheadAttention's function: dropout on the attention weights (11th argument)
    "Functional_multi_head_attention_forward": Special(_P, (10, "dropout_p"), None),
    # index outputs that are not unique on ties (where the dim argument is, its default)
    **{f"{t}_{n}": Special(_T, (1, "dim"), None) for t in ("Torch", "Tensor")
       for n in ("argmax", "argmin", "max", "min", "median", "nanmedian", "cummax", "cummin")},
    **{f"{t}_{n}": Special(_T, (1, "dim"), -1) for t in ("Torch", "Tensor") for n in ("sort", "argsort", "mode")},
    **{f"{t}_{n}": Special(_T, (2, "dim"), -1) for t in ("Torch", "Tensor") for n in ("topk", "kthvalue")},
    # scatters without accumulation (dim: 1st argument of the method, 2nd of the function)
    **{f"Tensor_{n}": Special(_S, (1, "dim"), None) for n in ("scatter", "scatter_")},
    "Torch_scatter": Special(_S, (1, "dim"), None),
}


def special_of(family: str) -> Optional[Special]:
    """The table's row for an API family (``Functional_dropout``), or None: judged by replay."""
    return TABLE.get(family)


def random_families() -> Tuple[str, ...]:
    """The families whose values are random draws (random generators and fills, dropout): the
    one list of random APIs (the advice names their category from it)."""
    return tuple(f for f, s in TABLE.items() if s.treatment in (Treatment.RANDOM, Treatment.DROPOUT))


def _arg(spec: Mapping[str, Any], pos: int, kw: str, default: Any) -> Any:
    kwargs = spec.get("kwargs") or {}
    if kw in kwargs:
        return kwargs[kw]
    args = spec.get("args") or []
    return args[pos] if len(args) > pos else default


def probability_arg(special: Special, spec: Mapping[str, Any]) -> Optional[float]:
    """The call's probability argument (dropout ``p``, sdpa ``dropout_p``) as a float, or None
    when it is not a plain number."""
    pos, kw = special.arg or (None, None)
    if pos is None:
        return None
    v = _arg(spec, pos, kw, special.default)
    return float(v) if type(v) is float or (type(v) is int and abs(v) <= 2 ** 63) else None


def training_arg(spec: Mapping[str, Any]) -> bool:
    """Dropout's ``training`` argument (3rd or keyword; default True)."""
    v = _arg(spec, 2, "training", True)
    return bool(v) if isinstance(v, bool) else True


def dim_arg(special: Special, spec: Mapping[str, Any]) -> Optional[int]:
    """The call's ``dim`` argument (None: over the flattened tensor, or not a plain int)."""
    pos, kw = special.arg or (None, None)
    if pos is None:
        return None
    v = _arg(spec, pos, kw, special.default)
    return v if type(v) is int else None
