"""assert_precision / evaluate on a plain CompareResult (outside the fixture), on real dumps."""
import pytest
import torch

import example_models as em
from pytest_ptdbg import PrecisionError, assert_precision, compare
from pytest_ptdbg.assertions import evaluate
from pytest_ptdbg.plugin_compat import to_thresholds
from pytest_ptdbg.plugin_options import Settings
from pytest_ptdbg.plugin_run import preserved_rng, run_model


def _flip_second_layer(model, batch):
    model.fc2.weight.data.mul_(-1.0)      # the device under test computes fc2 with a wrong sign
    return em.train_step(model, batch)


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("dumps")
    model, batch = em.mlp()
    cpu = torch.device("cpu")
    sides = {}
    with preserved_rng([cpu]):
        for name, step in (("npu", _flip_second_layer), ("bench", em.train_step)):
            sides[name] = run_model(model, batch, step, device=cpu, dtype="float32",
                                    dump_path=str(root / name), settings=Settings(),
                                    summary_only=False)
    params = {"npu_pkl_path": sides["npu"].pkl_path, "bench_pkl_path": sides["bench"].pkl_path,
              "npu_dump_data_dir": sides["npu"].data_dir,
              "bench_dump_data_dir": sides["bench"].data_dir, "is_print_compare_log": False}
    return params, root


def test_failure_message_and_sufficient_tolerance(dumps):
    params, root = dumps
    result = compare(params, str(root / "out"), stack_mode=True)
    with pytest.raises(PrecisionError) as exc:
        assert_precision(result)
    msg = str(exc.value)
    assert "first suspect: " in msg and "would have passed with: assert_precision(" in msg
    assert result.html_path in msg and result.csv_path in msg
    ev = exc.value.evaluation
    assert not ev.passed and ev.n_failed > 0 and ev.needed
    # the tolerance the message offers does pass when given to compare
    loose = Settings(thresholds=ev.needed)
    again = compare(params, str(root / "loose"), rule="ptdbg", thresholds=to_thresholds(loose))
    assert evaluate(again).passed


def test_ignore_lists_and_rule_overrides_on_a_compare_result(dumps):
    params, root = dumps
    result = compare(params, str(root / "out2"), stack_mode=True)
    # only the first linear (before the flipped layer) is judged: it agrees
    assert_precision(result, only=["Functional_linear_0_forward"])
    assert evaluate(result, ignore=["linear_0"]).n_ignored > 0
    with pytest.raises(TypeError, match="give the rule and thresholds to compare"):
        assert_precision(result, rule="dtype")
