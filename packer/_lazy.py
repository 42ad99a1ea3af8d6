"""One lazy module ``__getattr__`` for every package that hands out names it does not
import up front (``packer``, ``packer.pack``, ``packer.storage``, ``packer.builder``,
``packer.pack.raw``, ``packer.sources.annotations``), so ``import packer`` and each stage package stay light: a name's
module is imported the first time the name is asked for, and the value is kept in the
module's globals so the next lookup is an ordinary one. Standard library only."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_getattr(
    module: str,
    names: Mapping[str, str | Callable[[], Any]],
    submodules: Iterable[str] = (),
) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` for ``module`` (pass ``__name__``).

    ``names`` maps each lazy name to where it comes from: ``".child"`` (a module
    relative to ``module``'s package, or ``module`` itself for a package) or
    ``"packer.x.y"`` (absolute), either followed by ``":attr"`` when the attribute is
    named otherwise there; or a function of no arguments that makes the value.
    ``submodules``: child modules of the package returned as modules (``packer.pack``),
    an AttributeError when absent, but a missing dependency of one is raised as it is.
    Any other name is an AttributeError, as Python's own.
    """
    children = frozenset(submodules)
    package = module if hasattr(sys.modules.get(module), "__path__") else module.rpartition(".")[0]

    def __getattr__(name: str) -> Any:
        if name in children:
            try:
                return importlib.import_module(f"{module}.{name}")
            except ModuleNotFoundError as e:
                if e.name != f"{module}.{name}":
                    raise  # a dependency is missing: say which, not "no attribute"
                raise AttributeError(f"module {module!r} has no attribute {name!r}") from None
        source = names.get(name)
        if source is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        if callable(source):
            value = source()
        else:
            where, _, attr = source.partition(":")
            value = getattr(importlib.import_module(where, package), attr or name)
        setattr(sys.modules[module], name, value)
        return value

    return __getattr__
