"""The pytest plugin end to end, with pytester: pass, fail with the advisor's text, skip on a
missing device, option precedence, ini options, keep policy (goldens: ``test_plugin_golden.py``).

Inner sessions run in-process (``runpytest``); the xdist test is in ``test_plugin_xdist.py``.
"""
import json
import os
import sys

import pytest

from pytest_ptdbg.format import records

pytest_plugins = ["pytester"]


def _summary(dump_dir):
    with open(os.path.join(dump_dir, "ptdbg_summary.json"), encoding="utf-8") as f:
        return json.load(f)


def test_pass_summary_json_and_junitxml(tester):
    tester.makepyfile(test_a="""
        from netlib import make, train_step

        def test_forward_backward(ptdbg_dump):
            model, batch = make()
            result = ptdbg_dump(model, batch)
            assert result.passed and result.first_suspect is None
            assert len(result.table) > 0 and result.csv_path.endswith(".csv")
            # the default step ran backward too (the forward returns a scalar loss)
            assert (result.table["_direction"] == "backward").any()
            assert (result.table["_direction"] == "forward").any()
            result.assert_precision()

        def test_train_step_with_dropout(ptdbg_dump):
            model, batch = make(p=0.5)   # same seeds on both sides: same dropout masks
            ptdbg_dump(model, batch, step=train_step).assert_precision()
    """)
    dump = tester.path / "dumps"
    res = tester.runpytest(f"--ptdbg-dump-dir={dump}", "--ptdbg-bench=cpu", "--ptdbg-device=cpu",
                           "--junitxml=out.xml")
    res.assert_outcomes(passed=2)
    res.stdout.fnmatch_lines(["*ptdbg precision summary*",
                              "PASS  test_a.py::test_forward_backward*first suspect: none*",
                              "*ptdbg: 2 comparison(s): 2 passed; artifacts in*"])
    doc = _summary(str(dump))
    assert doc["counts"] == {"passed": 2}
    assert {t["nodeid"] for t in doc["tests"]} == {"test_a.py::test_forward_backward",
                                                  "test_a.py::test_train_step_with_dropout"}
    assert all(t["kept"] is False and t["html"] is None for t in doc["tests"])  # keep=failed
    assert not (dump / "test_a.py").exists()
    xml = (tester.path / "out.xml").read_text()
    assert 'name="ptdbg_verdict" value="passed"' in xml


def test_failure_message_names_the_suspect_and_hides_internals(tester):
    tester.makepyfile(test_b="""
        from netlib import make, train_step
        from pytest_ptdbg import assert_precision

        def test_sign_flip(ptdbg_dump):
            model, batch = make()
            flipped, _ = make(k=-1.0)
            run = lambda m, b: train_step(flipped, b)
            result = ptdbg_dump.compare_runs(lambda m, b: train_step(m, b), train_step,
                                             flipped, batch)
            assert_precision(result)
    """)
    dump = tester.path / "dumps"
    res = tester.runpytest(f"--ptdbg-dump-dir={dump}")
    res.assert_outcomes(failed=0, passed=1)  # same callables, same model: nothing differs

    tester.makepyfile(test_b="""
        from netlib import make, train_step

        def flipped_step(model, batch):
            model.k = -1.0          # the implementation under test flips a sign
            return train_step(model, batch)

        def test_sign_flip(ptdbg_dump):
            model, batch = make()
            result = ptdbg_dump.compare_runs(flipped_step, train_step, model, batch)
            result.assert_precision()
    """)
    res = tester.runpytest(f"--ptdbg-dump-dir={dump}", "--junitxml=out.xml")
    res.assert_outcomes(failed=1)
    out = res.stdout.str()
    xml = (tester.path / "out.xml").read_text()
    assert 'name="ptdbg_verdict" value="failed"' in xml
    assert 'name="ptdbg_first_suspect" value="Tensor_mul_0_forward at ' in xml
    assert "PrecisionError: precision check failed" in out
    assert "first suspect: Tensor_mul_0_forward" in out
    assert "self.fc1(x) * self.k" in out            # where, in the user's code
    # the default judgement names the cause; no tolerance passes a root cause, so none is offered
    assert "root cause(s) found by the judgement" in out
    assert "Tensor_mul_0_forward [changed argument] other: -1.0 vs 1.0" in out
    assert "would have passed with" not in out
    assert "advice:" in out and "html:" in out
    # the plugin's own frames are hidden from the traceback
    assert "assertions.py" not in out and \
        all(os.path.join("plugin", f) not in out for f in ("fixture.py", "run.py"))
    doc = _summary(str(dump))
    (entry,) = doc["tests"]
    assert entry["verdict"] == "failed" and entry["test_outcome"] == "failed"
    assert entry["first_suspect"]["api"] == "Tensor_mul_0_forward"
    assert entry["kept"] and os.path.isfile(entry["html"])  # failing tests keep their reports
    worst = entry["worst"]  # the tensor with the largest error, and its metric
    assert worst["tensor"] and worst["max_abs_err"] > 0.001
    res.stdout.fnmatch_lines([
        f"FAIL  test_b.py::test_sign_flip  worst: {worst['tensor']} *"
        f"max_abs_err={worst['max_abs_err']:.4g} *first suspect: Tensor_mul_0_forward*",
        "*report: *.html"])


def test_missing_device_fails_when_named_and_skips_only_on_auto(tester):
    tester.makepyfile(test_c="""
        from netlib import make

        def test_on_npu(ptdbg_dump):
            model, batch = make()
            ptdbg_dump(model, batch).assert_precision()
    """)
    # a device named explicitly that is missing fails the test (a misconfigured CI job is red)
    res = tester.runpytest("--ptdbg-device=npu", "-rs")
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines(["*device under test 'npu' was asked for explicitly but is not "
                              "available*torch_npu*"])
    res = tester.runpytest("--ptdbg-device=cpu", "--ptdbg-bench=npu:3")
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines(["*the bench 'npu:3' was asked for explicitly*"])
    # only auto skips, and the summary says how many and why (a machine where auto finds no
    # device at all is simulated: the resolver raises DeviceUnavailable)
    tester.makeconftest("""
        import pytest
        from pytest_ptdbg.errors import DeviceUnavailable
        from pytest_ptdbg.plugin import fixture

        @pytest.fixture(autouse=True)
        def _no_device(monkeypatch):
            def none(name):
                raise DeviceUnavailable("no usable device here (simulated)")
            monkeypatch.setattr(fixture, "resolve_device", none)
    """)
    res = tester.runpytest("--ptdbg-device=auto", "-rs")
    res.assert_outcomes(skipped=1)
    res.stdout.fnmatch_lines(["*ptdbg: 1 test(s) skipped: device under test: no usable device "
                              "here (simulated) (1)*"])


def test_bad_option_is_a_usage_error(tester):
    tester.makepyfile(test_d="def test_x(): pass")
    res = tester.runpytest("--ptdbg-rule=fuzzy")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["*rule='fuzzy'; allowed: judge, ptdbg, dtype*"])
    res = tester.runpytest("--ptdbg-update")    # goldens are off in these sessions
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["*--ptdbg-golden=none: there is no golden to update*"])
    res = tester.runpytest("--ptdbg-unused=maybe")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["*unused='maybe'; allowed: fail, warn*"])


def test_cli_dtype_runs_the_device_under_test_under_autocast(tester):
    tester.makepyfile(test_bf="""
        from netlib import make

        def test_bf16(ptdbg_dump):
            model, batch = make()
            result = ptdbg_dump(model, batch)
            lin = result.table[result.table["_api"] == "Functional_linear_0_forward"]
            assert set(lin["NPU Tensor Dtype"]) >= {"torch.bfloat16"}
            assert "torch.bfloat16" not in set(lin["Bench Tensor Dtype"])
            result.assert_precision()
    """)
    res = tester.runpytest("--ptdbg-device=cpu", "--ptdbg-dtype=bf16", "--ptdbg-bench=cpu",
                           "--ptdbg-rule=dtype", "--ptdbg-rtol=0.05", "--ptdbg-atol=0.01")
    res.assert_outcomes(passed=1)


def test_marker_and_argument_choose_the_dump_mode(tester):
    tester.makepyfile(test_mode="""
        import pytest
        import os
        from netlib import make

        @pytest.mark.ptdbg(mode="api_list", api_list=["linear"])
        def test_marker_api_list(ptdbg_dump):
            model, batch = make()
            table = ptdbg_dump(model, batch).table
            assert len(table) and table["_api"].str.contains("linear").all()
            assert (table["_direction"] == "backward").any()

        def test_argument_list_scope(ptdbg_dump):
            model, batch = make()
            result = ptdbg_dump(model, batch, mode="list", scope=["Torch_tanh_0_forward"])
            assert set(result.table["_api"]) == {"Torch_tanh_0_forward"}
            assert result.npu.pkl_path.endswith(os.sep + "list_dump.pkl")

        @pytest.mark.ptdbg(mode="api_list")
        def test_api_list_needs_names(ptdbg_dump):
            ptdbg_dump(*make())
    """)
    res = tester.runpytest("--strict-markers", f"--ptdbg-dump-dir={tester.path / 'd'}")
    res.assert_outcomes(passed=2, failed=1)
    res.stdout.fnmatch_lines(["*@pytest.mark.ptdbg on *test_api_list_needs_names*api_list=[]*"])


def test_precedence_argument_marker_ini_default(tester):
    tester.makeini("""
        [pytest]
        ptdbg_rule = dtype
        ptdbg_cosine = 0.5
        ptdbg_max_abs = 0.25
        ptdbg_keep = all
        ptdbg_ignore =
            optimizer_thing
    """)
    tester.makepyfile(test_p="""
        import pytest

        def test_ini_and_cli(ptdbg_dump):
            s = ptdbg_dump.settings()
            assert (s.rule, s.keep, s.seed, s.device) == ("dtype", "all", 7, "auto")
            assert s.thresholds == {"cosine": 0.5, "max_abs": 0.25}
            assert s.ignore == ("optimizer_thing",)

        @pytest.mark.ptdbg(cosine=0.8, rule="ptdbg", ignore=["dropout"])
        def test_marker_over_ini(ptdbg_dump):
            s = ptdbg_dump.settings()
            assert s.rule == "ptdbg" and s.thresholds == {"cosine": 0.8, "max_abs": 0.25}
            assert s.ignore == ("dropout",)

        @pytest.mark.ptdbg(cosine=0.8)
        def test_argument_over_marker(ptdbg_dump):
            s = ptdbg_dump.settings(cosine=0.9, keep="none")
            assert s.thresholds["cosine"] == 0.9 and s.keep == "none"

        @pytest.mark.ptdbg(cosinus=0.8)
        def test_unknown_marker_key(ptdbg_dump):
            ptdbg_dump.settings()
    """)
    res = tester.runpytest("--ptdbg-seed=7", "--strict-markers")
    res.assert_outcomes(passed=3, failed=1)
    res.stdout.fnmatch_lines(["*unknown argument(s) 'cosinus'; allowed:*"])


def test_marker_thresholds_decide_and_argument_wins(tester):
    tester.makepyfile(test_m="""
        import pytest
        from pytest_ptdbg import PrecisionError
        from netlib import make, train_step

        def scaled_step(model, batch):
            model.k = 1.02              # a 2% drift in one op
            return train_step(model, batch)

        @pytest.mark.ptdbg(rule="dtype", rtol=0.1, atol=0.1)
        def test_loose_marker_passes_strict_argument_fails(ptdbg_dump):
            model, batch = make()
            result = ptdbg_dump.compare_runs(scaled_step, train_step, model, batch)
            result.assert_precision()
            with pytest.raises(PrecisionError, match="Tensor_mul_0_forward"):
                result.assert_precision(rtol=1e-4, atol=1e-6)
            # allow-list: only the first linear, upstream of the drift, is judged
            result.assert_precision(only=["Functional_linear_0_forward"], rtol=1e-4, atol=1e-6)
    """)
    res = tester.runpytest("--strict-markers", f"--ptdbg-dump-dir={tester.path / 'd'}")
    res.assert_outcomes(passed=1)


def test_ini_dump_dir_and_keep_policy(tester):
    tester.makeini("""
        [pytest]
        ptdbg_dump_dir = artifacts
        ptdbg_keep = none
    """)
    tester.makepyfile(test_k="""
        import pytest
        from netlib import make, train_step

        def flipped(model, batch):
            model.k = -1.0
            return train_step(model, batch)

        def test_fails(ptdbg_dump):
            model, batch = make()
            ptdbg_dump.compare_runs(flipped, train_step, model, batch).assert_precision()

        @pytest.mark.ptdbg(keep="all")
        def test_kept(ptdbg_dump):
            model, batch = make()
            ptdbg_dump(model, batch).assert_precision()
    """)
    res = tester.runpytest()
    res.assert_outcomes(passed=1, failed=1)
    art = tester.path / "artifacts"
    doc = _summary(str(art))
    kept = {t["nodeid"].split("::")[1]: t["kept"] for t in doc["tests"]}
    assert kept == {"test_fails": False, "test_kept": True}
    assert not (art / "test_k.py" / "test_fails").exists()
    assert (art / "test_k.py" / "test_kept" / "compare").is_dir()


def test_default_dump_dir_follows_basetemp(tester):
    tester.makepyfile(test_t="""
        from netlib import make

        def test_x(ptdbg_dump, tmp_path):
            model, batch = make()
            r = ptdbg_dump(model, batch, keep="all")
            assert (tmp_path / "f").write_text("x")  # tmp_path does not wipe the dumps
            assert r.html_path and __import__("os").path.isfile(r.html_path)
    """)
    base = tester.path / "bt"
    res = tester.runpytest(f"--basetemp={base}")
    res.assert_outcomes(passed=1)
    assert (base / "ptdbg" / "ptdbg_summary.json").is_file()
    assert (base / "ptdbg" / "test_t.py" / "test_x" / "compare").is_dir()


def test_default_dump_dir_is_the_cache_with_one_folder_per_session(tester):
    """Without --basetemp/--ptdbg-dump-dir (pytester always passes --basetemp: run pytest
    directly in a subprocess)."""
    tester.makepyfile(test_r="""
        from netlib import make

        def test_x(ptdbg_dump):
            model, batch = make()
            ptdbg_dump(model, batch, keep="all").assert_precision()
    """)
    root = tester.path / ".pytest_cache" / "d" / "ptdbg"
    root.mkdir(parents=True)
    for i in range(4):  # three earlier sessions; only the two newest survive the next one
        (root / f"run-2020010{i}-000000-1").mkdir()
        os.utime(root / f"run-2020010{i}-000000-1", (1e9 + i, 1e9 + i))
    res = tester.run(sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:randomly")
    assert res.ret == 0, res.stdout.str()
    runs = sorted(p.name for p in root.iterdir() if p.name.startswith("run-"))
    assert runs[:2] == ["run-20200102-000000-1", "run-20200103-000000-1"] and len(runs) == 3
    doc = _summary(str(root))
    assert doc["run_dir"] == str(root / runs[-1])
    index = (root / "index.html").read_text()
    assert "test_r.py::test_x" in index and f'href="{runs[-1]}/' in index
    assert os.path.isfile(doc["tests"][0]["html"])


def test_directory_options_naming_a_file_are_usage_errors(tester, tmp_path, monkeypatch):
    """``--ptdbg-golden=/dev/null`` (or a path under a file) is a one-line usage error at start,
    not a NotADirectoryError traceback in the test (issue 18, item 2)."""
    tester.makepyfile(test_d="""
        from netlib import make

        def test_x(ptdbg_dump):
            model, batch = make()
            ptdbg_dump(model, batch).assert_precision()
    """)
    afile = tmp_path / "a_file.txt"
    afile.write_text("x")
    for args, shown in ((["--ptdbg-golden=/dev/null"], "--ptdbg-golden=/dev/null: /dev/null is not a directory"),
                        ([f"--ptdbg-golden={afile}/sub"], f"*lies under {afile}, which is not a directory*"),
                        ([f"--ptdbg-dump-dir={afile}"], f"--ptdbg-dump-dir={afile}: {afile} is not a directory*")):
        res = tester.runpytest(*args)
        assert res.ret == pytest.ExitCode.USAGE_ERROR, res.stdout.str()
        res.stderr.fnmatch_lines([f"ERROR: *{shown}*"])
        assert "Traceback" not in res.stderr.str() + res.stdout.str()
    tester.makeini("[pytest]\nptdbg_golden = /dev/null\n")
    monkeypatch.setenv("PYTEST_ADDOPTS", "")    # the tester's --ptdbg-golden=none would win
    res = tester.runpytest()
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["ERROR: *ptdbg_golden=/dev/null: /dev/null is not a directory*"])
