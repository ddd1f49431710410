"""Folding replay verdicts into the advisor's findings (advise/replay_merge.py): pure, no torch."""
import math
import os
import subprocess
import sys

from pytest_ptdbg.advise.advisor import Advice, Suspect
from pytest_ptdbg.judge.replay_check import ReplayVerdict
from pytest_ptdbg.advise.replay_merge import apply_replay, clearly_inherited, targets

from locations import TESTS_DIR


def _s(api, kind="own", role="origin"):
    return Suspect(api=api, direction="forward", kind=kind, csv_line=2, stack=None, input_error=1e-7,
                   output_error=1e-3, growth=1e4, category="computation", advice="ADVICE", family="Torch_x",
                   role=role)


def _v(api, verdict, own, obs=1e-3, inp=1e-6, oracle=1e-8):
    return ReplayVerdict(api, verdict, "why", own_error=own, observed_error=obs, input_error=inp,
                         oracle_error=oracle, amplification=obs / inp, used_bench_call=True)


def test_clearly_inherited_needs_small_own_and_oracle_errors():
    assert clearly_inherited(_v("a", "inherited", 0.0))
    assert not clearly_inherited(_v("a", "inherited", 2e-4))            # 20% of the observed: not clear
    assert not clearly_inherited(_v("a", "inherited", 0.0, oracle=5e-4))  # off the float64 oracle
    assert clearly_inherited(_v("a", "inherited", 0.0, oracle=math.nan))  # integer inputs: no oracle
    assert not clearly_inherited(_v("a", "own", 1e-3))
    assert not clearly_inherited(_v("a", "inherited", 0.0, obs=math.nan))


def test_an_accurate_suspect_is_demoted_below_confirmed_ones():
    a, b, u, i = _s("A"), _s("B"), _s("U", kind="unpaired", role=""), _s("I", kind="inherited", role="")
    adv = Advice(suspects=[a, b, u, i])
    assert targets(adv) == [a, b]
    verdicts = [_v("A", "inherited", 0.0), _v("B", "own", 1e-3)]
    apply_replay(adv, verdicts)
    assert [s.api for s in adv.suspects] == ["B", "A", "U", "I"] and adv.first is b
    assert a.role == "amplifier" and a.replay == "inherited" and b.role == "origin" and b.replay == "own"
    assert a.advice.startswith("Replay check:") and "inherited and amplified about 1e+03 times" in a.advice
    assert a.advice.endswith("ADVICE") and "imprecise on identical inputs" in b.advice
    assert adv.replay == verdicts
    text = adv.text()
    assert "Replay check (each suspect" in text and "A: INHERITED" in text and "accurate on replay" in text
    assert adv.to_dict()["replay"][0]["api"] == "A"


def test_unclear_or_unknown_verdicts_keep_the_ranking():
    a, b = _s("A"), _s("B")
    adv = Advice(suspects=[a, b])
    apply_replay(adv, [_v("A", "inherited", 2e-4), ReplayVerdict("B", "unknown", "no call spec")])
    assert [s.api for s in adv.suspects] == ["A", "B"] and a.role == "origin"
    assert "not conclusive (no call spec)" in b.advice


def test_dumps_without_recorded_calls_skip_the_check_without_torch(tmp_path):
    """ptdbg/msprobe dumps record no call arguments: nothing to re-run, and torch stays unloaded."""
    import dumps

    dumps.write_dump(str(tmp_path / "npu"), dumps.mlp_apis(fault="forward", fault_scale=0.5))
    dumps.write_dump(str(tmp_path / "bench"), dumps.mlp_apis())
    code = ("import sys; from pytest_ptdbg import compare; "
            f"r = compare({{'npu_pkl_path': {str(tmp_path / 'npu')!r}, 'bench_pkl_path': {str(tmp_path / 'bench')!r}, "
            f"'is_print_compare_log': False}}, {str(tmp_path / 'out')!r}, rule='dtype'); "
            "assert not r.summary_compare and r.advice.root_causes and r.advice.replay == []; "
            "assert any('replay check skipped' in p for p in r.notes), r.notes; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS_DIR, os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=str(tmp_path), env=env)
    assert p.returncode == 0, p.stderr
