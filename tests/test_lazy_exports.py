"""The packages that import their public names on first use (clearformer.lazy_exports): every
name of ``__all__`` resolves to the object its module defines and is listed by ``dir()``
before it loads, an unknown name is an AttributeError naming the package, and importing a
package does not import its heavy modules."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

PACKAGES = [
    "clearformer",
    "clearformer.precision",
    "clearformer.quant",
    "clearformer.serve",
    "clearformer.text",
    "clearformer.train",
]


@pytest.mark.parametrize("name", PACKAGES)
def test_every_public_name_resolves_and_is_listed(name):
    import clearformer.lazy_exports

    assert callable(clearformer.lazy_exports.lazy_exports)  # the module, not shadowed
    if name == "clearformer.serve":
        pytest.importorskip("starlette")
        pytest.importorskip("uvicorn")
    package = importlib.import_module(name)
    listed = dir(package)
    for public in package.__all__:
        assert public in listed, f"{name}.{public} missing from dir()"
        value = getattr(package, public)
        assert value is not None
        defined_in = getattr(value, "__module__", None)
        if defined_in is not None and defined_in.startswith("clearformer"):
            # The object its own module defines, not a copy.
            assert getattr(sys.modules[defined_in], public, value) is value
    with pytest.raises(AttributeError, match=rf"module '{name}' has no attribute 'no_such_name'"):
        package.no_such_name  # noqa: B018


def test_importing_the_packages_loads_neither_torch_nor_starlette():
    # clearformer.serve is left out: its config and model specs import torch by design.
    code = (
        "import sys, clearformer, clearformer.text, clearformer.train, clearformer.precision, "
        "clearformer.quant; "
        "print(sorted(m for m in ('torch', 'starlette', 'uvicorn') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
