"""A test module that needs an optional library skips where it is not installed, without
importing it while the tests are collected (issue 45, item 12).

``pytest.importorskip`` at a module's top imports the library at collection: every
pytest-xdist worker collects every module, so each paid for datasets (0.7 CPU-s),
lightning (0.8) and webdataset (0.2) before its first test, also the worker that runs
none of those tests. :func:`needs` asks the import system whether the package is
there (``importlib.util.find_spec``, which reads no module of it); the tests import it
when they run.
"""

from __future__ import annotations

import importlib.util

import pytest


def installed(name: str) -> bool:
    """Whether the top-level package ``name`` can be imported (it is not imported)."""
    if "." in name:
        raise ValueError(f"{name!r}: a top-level package (find_spec imports a parent)")
    return importlib.util.find_spec(name) is not None


def needs(*names: str) -> pytest.MarkDecorator:
    """A ``skipif`` mark (a module's ``pytestmark``) naming the packages of ``names``
    that are not installed."""
    missing = [n for n in names if not installed(n)]
    return pytest.mark.skipif(bool(missing), reason=f"needs {', '.join(missing)} (not installed)")
