"""The test suite's own helpers leave nothing changed behind them (a helper that did once broke
every later test of a worker: see ``real_dumps.patched``)."""
from real_dumps import patched


class _Owner:
    def plain(self):
        return "plain"

    @staticmethod
    def static(x):
        return ("static", x)

    @classmethod
    def cls(cls):
        return cls


class _Child(_Owner):
    pass


def test_patched_puts_back_a_class_attribute_exactly_as_it_was():
    saved = dict(vars(_Owner))
    for name in ("plain", "static", "cls"):
        with patched(_Owner, name, staticmethod(lambda *a: "patched")):
            assert getattr(_Owner(), name)() == "patched"
    assert dict(vars(_Owner)) == saved
    assert _Owner().static(1) == ("static", 1) and _Owner.cls() is _Owner and _Owner().plain() == "plain"


def test_patched_removes_again_what_a_subclass_only_inherited():
    with patched(_Child, "static", staticmethod(lambda x: "child")):
        assert _Child().static(1) == "child" and _Owner().static(1) == ("static", 1)
    assert "static" not in vars(_Child) and _Child().static(2) == ("static", 2)


def test_patched_restores_a_module_or_instance_attribute():
    import math

    real = math.sqrt
    with patched(math, "sqrt", lambda x: 0.0):
        assert math.sqrt(4.0) == 0.0
    assert math.sqrt is real
