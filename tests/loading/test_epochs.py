"""Order and resume as one composed object (issue 45.6): a PackLoader holds an
:class:`Epochs`; its passes and its sampler take that object (and a PassConfig), never
the loader's privates; the old base classes and re-exports are gone."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

import packer
from packer.errors import UsageError
from packer.loading.epochs import Epochs

LOADING = Path(packer.__file__).parent / "loading"


def test_the_loader_holds_one_epochs_object_and_inherits_no_helpers(packed: Path) -> None:
    loader = packer.PackLoader(packer.load(packed), 4, device="cpu", seed=3)
    assert type(loader).__bases__ == (object,)
    assert isinstance(loader.epochs, Epochs)
    assert loader.state_dict() == loader.epochs.state_dict()
    assert len(loader) == len(loader.epochs)
    loader.set_epoch(5)
    assert loader.epochs.epoch == 5 and loader.epoch == 5
    assert loader.indices(5).tolist() == loader.epochs.indices(5).tolist()


def test_the_sampler_and_the_pass_drive_the_same_epochs(packed: Path) -> None:
    loader = packer.PackLoader(packer.load(packed), 4, device="cpu", seed=3)
    sampler = loader.sampler
    assert sampler.epochs is loader.epochs and sampler.data_source is loader.dataset
    sampler.set_epoch(2)
    assert loader.epoch == 2
    assert list(sampler) == loader.indices(2).tolist()
    it = iter(loader)
    assert it.epochs is loader.epochs
    next(it)
    assert loader.state_dict()["epoch"] == 2 and loader.state_dict()["batches"] == 1
    it.close()
    with pytest.raises(UsageError, match="epoch must be"):
        sampler.set_epoch(-1)


def test_a_state_restores_through_the_epochs_object(packed: Path) -> None:
    pack = packer.load(packed)
    a = packer.PackLoader(pack, 3, device="cpu", seed=4)
    it = iter(a)
    next(it)
    state = a.state_dict()
    it.close()
    b = packer.PackLoader(pack, 3, device="cpu", seed=4)
    b.epochs.load_state_dict(state)
    assert b.state_dict() == state
    rest = [y.tolist() for _, y in b]
    want = [y.tolist() for _, y in packer.PackLoader(pack, 3, device="cpu", seed=4)][1:]
    assert rest == want


def _private_reads(path: Path, names: tuple[str, ...]) -> list[str]:
    """``x._name`` reads in ``path`` whose object is one of ``names``."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and isinstance(node.value, (ast.Name, ast.Attribute))
            and ast.unparse(node.value) in names
        ):
            bad.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return bad


def test_the_pass_and_the_sampler_never_touch_the_loader() -> None:
    for name in ("epoch_iterator.py", "sampler.py"):
        tree = ast.parse((LOADING / name).read_text(encoding="utf-8"))
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "loader" not in imported, name  # not even its type
        assert _private_reads(LOADING / name, ("ld", "loader", "self.loader")) == []


def test_the_mixins_and_old_import_paths_are_gone() -> None:
    for old in ("packer.loading.positions", "packer.loading.state"):
        assert importlib.util.find_spec(old) is None
    import packer.loading.loader as loader_module

    for name in ("IMAGENET_MEAN", "IMAGENET_STD", "Normalize", "batch_seed", "epoch_indices"):
        assert not hasattr(loader_module, name), name
    assert packer.batch_seed is packer.loading.order.batch_seed  # public names stay
    assert packer.PackSampler is packer.loading.sampler.PackSampler
