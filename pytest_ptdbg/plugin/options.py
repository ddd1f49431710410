"""Options of the pytest plugin: command line, ini, marker, helper argument, and their resolution.

Every setting has a command-line flag ``--ptdbg-NAME`` and an ini key ``ptdbg_NAME``; the
command line wins over the ini file. Per test, the ``@pytest.mark.ptdbg(...)`` marker wins over
both, and an argument given to ``ptdbg_dump(...)`` / ``assert_precision(...)`` wins over the
marker: **argument > marker > command line / ini > default**.

No torch here: pytest imports this module for every session.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple

from pytest_ptdbg.comparison.rule import Rule

DEVICES = ("auto", "cpu", "cuda", "npu")
DTYPES = {"float32": "float32", "fp32": "float32", "float": "float32",
          "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16", "half": "float16"}
KEEP = ("failed", "all", "none")
#: ``judge``: compare()'s default judgement (every call replayed against a float64 oracle; a step
#: fails on a root cause or unusable data); ``ptdbg`` / ``dtype``: the per-tensor threshold rules
RULES = tuple(Rule)
#: thresholds of the dtype rule; any other threshold belongs to the ptdbg rule
DTYPE_THRESHOLDS = ("rtol", "atol", "max_fail_fraction")
RANDOM = ("cpu", "native")
#: dump modes of ``PrecisionDebugger.configure_hook`` a test may ask for (``stack`` writes no
#: tensors and ``acl`` needs an ACL config: neither gives two dumps to compare)
MODES = ("api_stack", "all", "list", "range", "api_list")
#: ``--ptdbg-golden=none``: never use goldens (device and bench alike compare the code with itself)
GOLDEN_OFF = "none"
UNUSED = ("fail", "warn")

#: threshold name -> help. Names match ``comparison.verdict.Thresholds`` (``rtol``/``atol`` set the
#: dtype rule's tolerances for every float dtype).
THRESHOLDS: Dict[str, str] = {
    "cosine": "ptdbg rule: a tensor fails when cosine < this and max abs err > max_abs (0.99)",
    "max_abs": "ptdbg rule: absolute error allowed together with a low cosine (0.001)",
    "cosine_hard": "ptdbg rule: a tensor always fails when cosine < this (0.9)",
    "max_abs_hard": "ptdbg rule: a tensor always fails when max abs err > this (1.0)",
    "summary_rel": "ptdbg rule, statistics-only compare: largest relative difference of max/min/"
                   "mean/l2norm (0.5)",
    "rtol": "dtype rule: relative tolerance for every float dtype (default: assert_close's for the "
            "lower-precision dtype of the pair)",
    "atol": "dtype rule: absolute tolerance (default 1e-5)",
    "max_fail_fraction": "dtype rule: fraction of elements allowed outside atol + rtol*|bench| (0)",
}


@dataclass(frozen=True)
class Settings:
    """Everything one ``ptdbg_dump`` call needs to know, after resolution."""

    device: str = "auto"
    bench: str = "cpu"
    dtype: str = "float32"
    rule: Rule = Rule.JUDGE
    thresholds: Mapping[str, float] = field(default_factory=dict)
    keep: str = "failed"
    summary_only: bool = False
    seed: int = 1234
    deterministic: bool = False
    random: str = "cpu"
    ignore: Tuple[str, ...] = ()
    only: Tuple[str, ...] = ()
    ignore_optimizer: bool = False
    #: explicit golden directory; None: ``__ptdbg__`` beside each test file; GOLDEN_OFF: none
    golden: Optional[str] = None
    update_golden: bool = False
    golden_ci: bool = False
    unused: str = "fail"
    #: what is dumped on both sides: ``configure_hook(mode, scope, api_list, filter_switch)``
    mode: str = "api_stack"
    scope: Tuple[str, ...] = ()
    api_list: Tuple[str, ...] = ()
    filter_switch: str = "OFF"


#: keys accepted by the marker and by ``ptdbg_dump(...)`` (thresholds are accepted by name too)
PER_TEST_KEYS = ("device", "bench", "dtype", "rule", "thresholds", "keep", "summary_only", "seed",
                 "deterministic", "random", "ignore", "only", "ignore_optimizer",
                 "mode", "scope", "api_list", "filter_switch")


@dataclass(frozen=True)
class _Opt:
    name: str          # Settings field
    kind: str          # "str" | "bool" | "int" | "float" | "path"
    help: str
    choices: Optional[Iterable[str]] = None
    aliases: Tuple[str, ...] = ()


_OPTIONS = (
    _Opt("device", "str", "device under test: auto (npu if torch_npu has a device, else cuda, else "
         "cpu), cpu, cuda, npu or e.g. cuda:1 [ini: ptdbg_device; default auto]"),
    _Opt("bench", "str", "reference (bench) device: cpu, cuda, npu [ini: ptdbg_bench; default cpu]"),
    _Opt("dtype", "str", "autocast dtype on the device under test: float32 (no autocast), bfloat16, "
         "float16 [ini: ptdbg_dtype; default float32]", tuple(DTYPES)),
    _Opt("rule", "str", "verdict: judge (every call replayed against a float64 oracle; fails on a "
         "root cause or unusable data), or the per-tensor threshold rules ptdbg (cosine/abs error) "
         "and dtype (assert_close tolerances of the lower-precision dtype); a threshold given "
         "without a rule selects its rule [ini: ptdbg_rule; default judge]",
         RULES),
    _Opt("keep", "str", "which tests keep their dumps and reports: failed, all, none "
         "[ini: ptdbg_keep; default failed]", KEEP),
    _Opt("dump_dir", "path", "where dumps, CSV/advisor/HTML reports and ptdbg_summary.json go "
         "[ini: ptdbg_dump_dir; default: <basetemp>/ptdbg with --basetemp, else "
         ".pytest_cache/d/ptdbg, one run-* folder per session]"),
    _Opt("golden", "path", "golden directory (default: a __ptdbg__ folder beside each test "
         "file). Goldens are the reference when device and bench are the same device in the same "
         "dtype (a CPU-only machine); 'none' turns them off [ini: ptdbg_golden]"),
    _Opt("update_golden", "bool", "write the goldens that are missing or that this run's "
         "judgement sees as changed, remove unused ones [ini: ptdbg_update_golden]",
         aliases=("--ptdbg-update",)),
    _Opt("golden_ci", "bool", "never write a missing golden, only fail (also when the CI "
         "environment variable is set) [ini: ptdbg_golden_ci]"),
    _Opt("unused", "str", "unused goldens (their test or call is gone): fail the run, or warn "
         "[ini: ptdbg_unused; default fail]", UNUSED),
    _Opt("summary_only", "bool", "dump statistics only, no .npy tensors (faster; compare by "
         "statistics) [ini: ptdbg_summary_only]"),
    _Opt("seed", "int", "seed given to seed_all() right before each side's step "
         "[ini: ptdbg_seed; default 1234]"),
    _Opt("deterministic", "bool", "seed_all(mode=True): deterministic algorithms on both sides "
         "[ini: ptdbg_deterministic]"),
    _Opt("random", "str", "where dropout masks and torch.rand/randn/bernoulli/uniform_/normal_ "
         "draw their numbers: cpu (one seeded CPU generator for both sides, so a CUDA/NPU side "
         "gets the bench's masks) or native (each device's own generator, seeded alike) "
         "[ini: ptdbg_random; default cpu]", RANDOM),
    _Opt("ignore_optimizer", "bool", "leave the optimizer's APIs out of the verdict "
         "[ini: ptdbg_ignore_optimizer]"),
)


def flag(name: str) -> str:
    return "--ptdbg-" + name.replace("_", "-")


def ini_name(name: str) -> str:
    return "ptdbg_" + name


def addoption(parser: Any) -> None:
    """Register the ``--ptdbg-*`` options and their ini keys in one group."""
    group = parser.getgroup("ptdbg", "precision regression testing (pytest-ptdbg)")
    for opt in _OPTIONS:
        dest = "ptdbg_" + opt.name
        if opt.kind == "bool":
            group.addoption(*opt.aliases, flag(opt.name), action="store_true", default=None, dest=dest,
                            help=opt.help)
            parser.addini(ini_name(opt.name), opt.help, type="bool", default=None)
        else:
            group.addoption(flag(opt.name), action="store", default=None, dest=dest,
                            metavar=opt.name.upper(), help=opt.help)
            parser.addini(ini_name(opt.name), opt.help, default=None)
    for name, text in THRESHOLDS.items():
        group.addoption(flag(name), action="store", default=None, dest="ptdbg_t_" + name,
                        metavar="VALUE", help=f"threshold: {text} [ini: ptdbg_{name}]")
        parser.addini(ini_name(name), f"threshold: {text}", default=None)
    group.addoption("--ptdbg-ignore", action="append", default=None, dest="ptdbg_ignore",
                    metavar="API", help="leave APIs whose name contains API (case-insensitive) out "
                    "of the verdict; repeatable [ini: ptdbg_ignore, one per line]")
    parser.addini("ptdbg_ignore", "APIs left out of the verdict (substrings)", type="linelist",
                  default=[])


def _convert(opt_name: str, kind: str, value: Any, where: str) -> Any:
    if value is None:
        return None
    if kind == "bool":
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off", ""):
            return False
        raise ValueError(f"{where}: {opt_name}={value!r} is not a boolean (use true/false)")
    if kind == "int":
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: {opt_name}={value!r} is not an integer") from None
    if kind == "float":
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: threshold {opt_name}={value!r} is not a number") from None
    return str(value).strip()


def _validate(settings: Settings, where: str) -> Settings:
    dev_ok = lambda d: d.split(":")[0] in DEVICES  # noqa: E731
    if not dev_ok(settings.device):
        raise ValueError(f"{where}: device={settings.device!r}; allowed: {', '.join(DEVICES)} "
                         "(optionally with an index, e.g. cuda:1)")
    if not dev_ok(settings.bench) or settings.bench == "auto":
        raise ValueError(f"{where}: bench={settings.bench!r}; allowed: cpu, cuda, npu "
                         "(optionally with an index)")
    dtype = DTYPES.get(str(settings.dtype).replace("torch.", "").lower())
    if dtype is None:
        raise ValueError(f"{where}: dtype={settings.dtype!r}; allowed: float32, bfloat16, float16")
    if settings.rule not in RULES:
        raise ValueError(f"{where}: rule={settings.rule!r}; allowed: {', '.join(RULES)}")
    settings = replace(settings, rule=Rule(settings.rule))
    if settings.rule is Rule.JUDGE and settings.thresholds:  # thresholds are those of a per-tensor rule
        rule = Rule.DTYPE if any(k in DTYPE_THRESHOLDS for k in settings.thresholds) else Rule.PTDBG
        settings = replace(settings, rule=rule)
    if settings.random not in RANDOM:
        raise ValueError(f"{where}: random={settings.random!r}; allowed: {', '.join(RANDOM)}")
    if settings.unused not in UNUSED:
        raise ValueError(f"{where}: unused={settings.unused!r}; allowed: {', '.join(UNUSED)}")
    if settings.keep not in KEEP:
        raise ValueError(f"{where}: keep={settings.keep!r}; allowed: {', '.join(KEEP)}")
    for key in settings.thresholds:
        if key not in THRESHOLDS:
            raise ValueError(f"{where}: unknown threshold {key!r}; allowed: "
                             f"{', '.join(THRESHOLDS)}")
    _validate_mode(settings, where)
    return replace(settings, dtype=dtype)


def _validate_mode(settings: Settings, where: str) -> None:
    """The dump mode by the debugger's own rules (``config.validate_hook``; no torch there)."""
    from pytest_ptdbg.runtime.config import DebugConfig, validate_hook

    if settings.mode not in MODES:
        raise ValueError(f"{where}: mode={settings.mode!r}; allowed: {', '.join(MODES)}")
    try:
        validate_hook(DebugConfig(), mode=settings.mode, scope=list(settings.scope),
                      api_list=list(settings.api_list), filter_switch=settings.filter_switch)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def _resolve_path(value: Optional[str], base: str) -> Optional[str]:
    if not value:
        return None
    value = os.path.expanduser(value)
    return os.path.normpath(value if os.path.isabs(value) else os.path.join(base, value))


def _check_directory(path: Optional[str], name: str, given: Any) -> None:
    """A directory option names a directory, or a path that can become one (its nearest
    existing ancestor is a directory); ValueError (a usage error) otherwise."""
    if not path:
        return
    probe = path
    while not os.path.lexists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            return
        probe = parent
    if not os.path.isdir(probe):
        what = "is not a directory" if probe == path else f"lies under {probe}, which is not a directory"
        raise ValueError(f"{name}={given!s}: {path} {what}; give a directory (it is created when "
                         "missing)")


def session_settings(config: Any) -> Tuple[Settings, Optional[str]]:
    """Settings from the command line and the ini file (command line wins), validated, and the
    dump directory option (None when not given).

    Relative paths: from the invocation directory (command line) or the ini file's directory.
    """
    values: Dict[str, Any] = {}
    inv_dir = str(config.invocation_params.dir)
    ini_dir = str(config.inipath.parent) if config.inipath else str(config.rootpath)
    for opt in _OPTIONS:
        cli = config.getoption("ptdbg_" + opt.name)
        ini = config.getini(ini_name(opt.name))
        ini = None if ini in ("", None) else ini
        kind = "str" if opt.kind == "path" else opt.kind
        if cli is not None:
            value, where, base = _convert(opt.name, kind, cli, flag(opt.name)), "cli", inv_dir
        elif ini is not None:
            value, where, base = _convert(opt.name, kind, ini, ini_name(opt.name)), "ini", ini_dir
        else:
            continue
        if opt.name == "golden" and str(value).strip().lower() in (GOLDEN_OFF, "off"):
            value = GOLDEN_OFF
        elif opt.kind == "path":
            value = _resolve_path(value, base)
            _check_directory(value, flag(opt.name) if where == "cli" else ini_name(opt.name), cli
                             if where == "cli" else ini)
        values[opt.name] = value
    thresholds: Dict[str, float] = {}
    for name in THRESHOLDS:
        cli = config.getoption("ptdbg_t_" + name)
        ini = config.getini(ini_name(name))
        if cli is not None:
            thresholds[name] = _convert(name, "float", cli, flag(name))
        elif ini not in (None, ""):
            thresholds[name] = _convert(name, "float", ini, ini_name(name))
    ignore = config.getoption("ptdbg_ignore") or config.getini("ptdbg_ignore") or []
    dump_dir = values.pop("dump_dir", None)
    settings = Settings(**values, thresholds=thresholds, ignore=tuple(ignore))
    if settings.update_golden and settings.golden == GOLDEN_OFF:
        raise ValueError("--ptdbg-update-golden with --ptdbg-golden=none: there is no golden "
                         "to update")
    return _validate(settings, "pytest-ptdbg options"), dump_dir


def per_test(base: Settings, overrides: Mapping[str, Any], where: str) -> Settings:
    """``base`` with per-test overrides (marker kwargs or helper arguments) applied.

    Threshold names may be given directly (``cosine=0.95``) or as ``thresholds={...}``; they are
    merged over the thresholds of ``base``. ``ignore``/``only`` accept a string or a list.
    """
    overrides = dict(overrides)
    thresholds = dict(base.thresholds)
    thresholds.update(overrides.pop("thresholds", None) or {})
    for key in list(overrides):
        if key in THRESHOLDS:
            thresholds[key] = _convert(key, "float", overrides.pop(key), where)
    unknown = [k for k in overrides if k not in PER_TEST_KEYS]
    if unknown:
        raise ValueError(f"{where}: unknown argument(s) {', '.join(map(repr, unknown))}; allowed: "
                         f"{', '.join(PER_TEST_KEYS + tuple(THRESHOLDS))}")
    changes: Dict[str, Any] = {}
    for key, value in overrides.items():
        if value is None:
            continue
        if key in ("ignore", "only", "scope", "api_list"):
            value = tuple(value) if isinstance(value, (list, tuple, set)) else (value,)
        elif key == "filter_switch":
            value = ("ON" if value else "OFF") if isinstance(value, bool) else str(value).upper()
        elif key in ("summary_only", "deterministic", "ignore_optimizer"):
            value = _convert(key, "bool", value, where)
        elif key == "seed":
            value = _convert(key, "int", value, where)
        elif key == "dtype":
            value = str(value).replace("torch.", "")
        changes[key] = value
    return _validate(replace(base, thresholds=thresholds, **changes), where)


def marker_overrides(item: Any) -> Dict[str, Any]:
    """Keyword arguments of the ``ptdbg`` markers on ``item``, closest marker winning."""
    merged: Dict[str, Any] = {}
    for mark in reversed(list(item.iter_markers("ptdbg"))):
        if mark.args:
            raise ValueError(f"@pytest.mark.ptdbg on {item.nodeid}: takes keyword arguments only "
                             f"(got positional {mark.args!r})")
        merged.update(mark.kwargs)
    return merged


MARKER_HELP = ("ptdbg(**settings): per-test pytest-ptdbg settings, overriding the command line and "
               "ini: thresholds by name (cosine, max_abs, cosine_hard, max_abs_hard, summary_rel, "
               "rtol, atol, max_fail_fraction), rule, dtype, device, bench, "
               "ignore=[api substrings], only=[...], "
               "ignore_optimizer, summary_only, seed, deterministic, random, keep, "
               "mode (api_stack, all, list, range, api_list), scope=[api names], "
               "api_list=[api name parts], filter_switch (ON/OFF)")
