"""Public names of a package loaded on first use, so that importing the package stays cheap.

A mechanism package lists where each public name lives; ``from workbench.elastic import plan_io``
then imports ``workbench.elastic.planner`` only at that moment, and ``import workbench.kvcache``
alone loads no torch.
"""
from __future__ import annotations

import sys
from importlib import import_module
from typing import Callable


def lazy_exports(package: str, exports: dict[str, str], aliases: dict[str, tuple[str, str]] | None = None,
                 ) -> tuple[Callable[[str], object], Callable[[], list[str]], list[str]]:
    """``__getattr__``, ``__dir__`` and ``__all__`` for ``package``.

    ``exports`` maps a public name to the submodule that defines it under that name; ``aliases`` maps a
    public name to (submodule, name there). A submodule given as ``workbench.x.y`` is a shared module the
    package re-exports. A name is imported once, then kept in the package.
    """
    where = {name: (module, name) for name, module in exports.items()} | dict(aliases or {})
    names = sorted(where)

    def __getattr__(name: str):
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attr = where[name]
        value = getattr(import_module(module if module.startswith("workbench.") else f"{package}.{module}"), attr)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return names

    return __getattr__, __dir__, names
