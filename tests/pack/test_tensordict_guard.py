"""``import packer`` alone makes tensordict's loaders safe on an untrusted pack.

Each import order runs in a fresh interpreter that imports only ``packer`` and
``tensordict``: a test process has long since imported ``packer.pack.reader``, which
would hide a hook installed only there. The interpreter is a fork of one that has
imported torch and torch._dynamo, which tensordict imports, and nothing of packer or
tensordict (tests/helpers/interpreted.py: 4.4 CPU-s a run before, 2 of them dynamo).
Each child has a timeout, so a hang (a FIFO read forever) fails the test instead of the
suite.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import subprocess_env
from helpers.interpreted import run_fresh

ENTRIES = (
    "tensordict.load_memmap",
    "tensordict.load",
    "tensordict.TensorDict.load_memmap",
    "tensordict.TensorDict.load",
    "tensordict.NonTensorData.load_memmap",
)

_CHILD = textwrap.dedent(
    """
    import json, sys
    order, cases = sys.argv[1], json.loads(sys.argv[2])
    if order == "packer-first":
        import packer, tensordict
    elif order == "tensordict-first":
        import tensordict, packer
    else:  # the public package only, then tensordict's submodules one by one
        import packer
        import tensordict._td, tensordict._base.serialization, tensordict.base, tensordict
    assert "packer.pack.reader" not in sys.modules, "the reader was imported up front"
    refs = {n: m._load_metadata for n, m in list(sys.modules.items())
            if n.startswith("tensordict") and hasattr(m, "_load_metadata")}
    print(json.dumps({"unguarded": sorted(
        n for n, f in refs.items() if not getattr(f, "_imgpack_guard", False)),
        "refs": sorted(refs)}))
    for entry, path in cases:
        fn = eval(entry, {"tensordict": tensordict})
        try:
            out = fn(path)
        except Exception as e:
            print(json.dumps({"error": type(e).__name__, "message": str(e)}))
        else:
            print(json.dumps({"type": type(out).__name__, "len": len(out)}))
    """
)


class _Payload:
    """Unpickling this makes the folder ``marker``: evidence that a pickle ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.makedirs, (self.marker,))


def _copy(packed: Path, dst: Path) -> Path:
    shutil.copytree(packed, dst)
    return dst


@pytest.mark.slow
@pytest.mark.xdist_group("fresh-interpreter")  # one zygote (helpers.interpreted.run_fresh)
@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("order", ["packer-first", "tensordict-first", "submodules"])
def test_import_packer_alone_guards_every_tensordict_entry(
    packed: Path, tmp_path: Path, order: str
) -> None:
    """A pack whose meta.json names NonTensorData beside a planted ``other.pickle``, one
    whose meta.json is a FIFO, one whose meta.json links to /dev/zero: refused through
    every documented tensordict entry, nothing unpickled, nothing hangs. A clean pack
    opens as ``packer.load`` does (the hook registers ImagePack)."""
    from tensordict import NonTensorData

    marker = tmp_path / "ran"
    pickled = _copy(packed, tmp_path / "pickled")
    (pickled / "other.pickle").write_bytes(pickle.dumps(_Payload(marker)))
    (pickled / "meta.json").write_text(json.dumps({"_type": str(NonTensorData)}))
    fifo = _copy(packed, tmp_path / "fifo")
    (fifo / "meta.json").unlink()
    os.mkfifo(fifo / "meta.json")
    zero = _copy(packed, tmp_path / "zero")
    (zero / "meta.json").unlink()
    (zero / "meta.json").symlink_to("/dev/zero")
    cases = [(e, str(pickled)) for e in ENTRIES]
    cases += [("tensordict.load_memmap", str(fifo)), ("tensordict.load", str(zero))]
    cases += [("tensordict.load_memmap", str(packed))]
    p = run_fresh(_CHILD, [order, json.dumps(cases)], env=subprocess_env(), timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    refs, *outs = (json.loads(line) for line in p.stdout.strip().splitlines())
    # tensordict binds its reader by name in several modules: none is left unguarded
    assert {"tensordict.base", "tensordict._td", "tensordict._base.serialization"} <= set(
        refs["refs"]
    )
    assert refs["unguarded"] == []
    for (entry, _), out in zip(cases[: len(ENTRIES)], outs):
        assert out.get("error") == "PackFormatError", (entry, out)
        assert "names type" in out["message"] and "NonTensorData" in out["message"], out
    assert not marker.exists(), "a planted pickle ran"
    fifo_out, zero_out, clean = outs[len(ENTRIES) :]
    assert fifo_out["error"] == "PackFormatError"
    assert "meta.json is not a regular file (a FIFO)" in fifo_out["message"]
    assert zero_out["error"] == "PackFormatError"
    assert "meta.json is not a regular file (a character device)" in zero_out["message"]
    assert clean == {"type": "ImagePack", "len": len(__import__("packer").load(packed))}


def test_import_packer_installs_the_hook_without_importing_torch() -> None:
    # also, in a process where torch is not yet imported, ``import packer`` sets no CUDA
    # queue variable (the forked environment test runs with torch already imported)
    code = (
        "import os, sys, packer\n"
        "from packer.pack.guard import installed\n"
        "print(installed(), 'torch' in sys.modules, 'tensordict' in sys.modules,\n"
        "      'CUDA_DEVICE_MAX_CONNECTIONS' in os.environ)"
    )
    env = subprocess_env()
    env.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    p = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split() == ["True", "False", "False", "False"]
