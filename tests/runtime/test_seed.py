import random

import numpy as np
import pytest
import torch

from example_models import tiny_gpt, train_step
from pytest_ptdbg import seed_all


def _draw():
    return random.random(), float(np.random.rand()), torch.rand(3)


def test_seed_all_repeats_every_rng():
    seed_all(7)
    a = _draw()
    seed_all(7)
    b = _draw()
    assert a[0] == b[0] and a[1] == b[1] and torch.equal(a[2], b[2])
    seed_all(8)
    assert not torch.equal(_draw()[2], a[2])


def test_seed_all_makes_a_training_step_repeatable():
    # tiny_gpt has dropout, which draws from the global RNG
    losses = []
    for _ in range(2):
        seed_all(1234)
        model, batch = tiny_gpt(seed=0)
        losses.append(train_step(model, batch))
    assert torch.equal(losses[0], losses[1])


def test_deterministic_mode_toggles():
    try:
        seed_all(1, mode=True)
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        seed_all(1, mode=False)
    assert not torch.are_deterministic_algorithms_enabled()


@pytest.mark.parametrize("kwargs, match", [
    (dict(seed=-1), "invalid seed=-1"),
    (dict(seed="1"), "invalid seed='1'"),
    (dict(seed=1, mode="yes"), "invalid mode='yes'"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        seed_all(**kwargs)
