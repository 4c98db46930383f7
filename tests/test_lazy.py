"""`fedhet.lazy.attach`: a package whose `TYPE_CHECKING` block lists its names imports each
name's module on first use, and only then; the block is the one list (a line it cannot load is
refused, a name left out of `__all__` too)."""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest

from fedhet.lazy import sources

INIT = '''
from typing import TYPE_CHECKING

from fedhet.lazy import attach

if TYPE_CHECKING:
    import {pkg}.tools as tools
    from {pkg}.heavy import Registry, make
    from {pkg}.light import VALUE as value

    register = Registry.register

__all__ = ["Registry", "make", "register", "tools", "value"]

if not TYPE_CHECKING:
    __getattr__, __dir__ = attach(__name__, __file__)
'''


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A throw-away package `lazypkg_<n>` whose `heavy` module counts its imports."""
    name = f"lazypkg_{tmp_path.name.replace('-', '_')}"
    root = tmp_path / name
    root.mkdir()
    (root / "__init__.py").write_text(INIT.format(pkg=name))
    (root / "heavy.py").write_text(textwrap.dedent("""
        import builtins
        builtins.LAZY_IMPORTS = getattr(builtins, "LAZY_IMPORTS", 0) + 1

        class Registry:
            @staticmethod
            def register(x):
                return ("registered", x)

        def make():
            return "made"
    """))
    (root / "light.py").write_text("VALUE = 42\n")
    (root / "tools.py").write_text("def tool():\n    return 'tool'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import builtins

    monkeypatch.setattr(builtins, "LAZY_IMPORTS", 0, raising=False)
    yield name
    for mod in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
        del sys.modules[mod]


def test_a_name_is_imported_on_first_use_and_kept(package):
    import builtins

    pkg = importlib.import_module(package)
    assert f"{package}.heavy" not in sys.modules and builtins.LAZY_IMPORTS == 0
    assert pkg.value == 42 and f"{package}.heavy" not in sys.modules  # only what is used
    assert pkg.make() == "made" and builtins.LAZY_IMPORTS == 1
    assert pkg.register("x") == ("registered", "x")  # `A = N.attr`: an attribute of a name
    assert pkg.tools.tool() == "tool"  # `import M as A`: the module itself
    assert "make" in vars(pkg) and builtins.LAZY_IMPORTS == 1  # kept: imported once
    assert {"Registry", "make", "register", "tools", "value"} <= set(dir(pkg))
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        pkg.nothing  # noqa: B018


def test_the_block_holds_only_imports_and_attributes_of_them(tmp_path):
    init = tmp_path / "__init__.py"
    init.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from a.b import c as d\n"
                    "    e = d.f.g\n")
    assert sources(str(init)) == {"d": ("a.b", ("c",)), "e": ("a.b", ("c", "f", "g"))}
    init.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    x = 1\n")
    with pytest.raises(ImportError, match="holds only"):
        sources(str(init))
    init.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    y = z.attr\n")
    with pytest.raises(ImportError, match="z is not imported above"):
        sources(str(init))


def test_a_name_of_the_block_missing_from_all_is_refused_on_import(package, tmp_path):
    init = tmp_path / package / "__init__.py"
    init.write_text(init.read_text().replace('"make", ', ""))
    with pytest.raises(ImportError, match=r"\['make'\] imported under TYPE_CHECKING but not in __all__"):
        importlib.import_module(package)
