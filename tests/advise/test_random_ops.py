"""The random APIs are listed once (judge/not_judged.py); the advice's category follows that list."""
from pytest_ptdbg.advise import advice_text as at
from pytest_ptdbg.judge.not_judged import Treatment, random_families, special_of


def test_every_random_family_of_the_judge_is_a_random_op_for_the_advice():
    for family in random_families():
        assert special_of(family).treatment in (Treatment.RANDOM, Treatment.DROPOUT)
        assert at.categorize(family, "own", "", [], []) == at.RANDOM, family


def test_an_nn_init_fill_is_random_draws_not_a_computation():
    # it was "computation": the advice's own list lacked nn.init's random fills
    assert at.categorize("NN_init_uniform_", "own", "", [], []) == at.RANDOM
    assert at.categorize("Torch_native_dropout", "own", "", [], []) == at.RANDOM
    assert at.categorize("Torch_matmul", "own", "", [], []) != at.RANDOM
