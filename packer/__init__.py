"""imgpack: pack an image folder into a memory-mapped tensordict and stream it to the GPU.

    import packer
    pack = packer.load("tensors/")            # ImagePack: images uint8 [N,3,H,W], labels int64 [N]
    loader = packer.PackLoader(pack, 256, device="cuda")
    model = torch.nn.Sequential(packer.Normalize(), net)
    for images, labels in loader: ...     # (images, labels, targets) for a pack with targets

The library behind the commands has one public name per function:
``packer.build_pack`` (``imgpack build``), ``packer.compress_tree`` (``imgpack
compress``), ``packer.verify_pack`` (``imgpack verify``), each taking its frozen
config (``BuildConfig``, ``CompressConfig``, ``VerifyConfig``) and returning its
result (``BuildResult``, ``CompressResult``, ``VerifyReport``); the errors they
raise are ``PackerError`` and its subclasses. ``packer.build``,
``packer.compress``, ``packer.verify`` etc. are always the submodules (where
those functions are defined), never functions.

Names are imported lazily, so ``imgpack --help`` and build workers stay light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._version import __version__

_EXPORTS = {
    "load": "packer.pack:open_pack",
    "ImagePack": "packer.pack:ImagePack",
    "PackLoader": "packer.loader:PackLoader",
    "PackSampler": "packer.loader:PackSampler",
    "batch_seed": "packer.loader:batch_seed",
    "Normalize": "packer.normalize:Normalize",
    "PackDataset": "packer.dataset:PackDataset",
    "split": "packer.dataset:split",
    "class_histogram": "packer.dataset:class_histogram",
    "build_pack": "packer.build:build",
    "BuildConfig": "packer.build:BuildConfig",
    "BuildResult": "packer.build:BuildResult",
    "compress_tree": "packer.compress:compress",
    "CompressConfig": "packer.compress:CompressConfig",
    "CompressResult": "packer.compress:CompressResult",
    "verify_pack": "packer.verify:verify",
    "VerifyConfig": "packer.verify:VerifyConfig",
    "VerifyReport": "packer.verify:VerifyReport",
    "show_pack": "packer.show:show_pack",
    "ShowConfig": "packer.show:ShowConfig",
    "ShowResult": "packer.show:ShowResult",
    "Manifest": "packer.format:Manifest",
    "PackerError": "packer.errors:PackerError",
    "UsageError": "packer.errors:UsageError",
    "InputError": "packer.errors:InputError",
    "PackFormatError": "packer.errors:PackFormatError",
    "PackBusyError": "packer.errors:PackBusyError",
    "DiskFullError": "packer.errors:DiskFullError",
    "WorkerDiedError": "packer.errors:WorkerDiedError",
    "NoUsableImagesError": "packer.errors:NoUsableImagesError",
    "FFmpegError": "packer.errors:FFmpegError",
}

# ``packer.<name>`` for these is the submodule, importable without an import statement
# first (so ``packer.build`` is never an AttributeError one moment and a module the next).
_SUBMODULES = (
    "baseline",
    "bench",  # imgpack bench, a peer of verify (a subpackage)
    "build",
    "cli",
    "compress",
    "dataset",
    "decode",
    "errors",
    "format",
    "labels",
    "loader",
    "normalize",
    "pack",
    "plots",
    "scan",
    "show",
    "timing",
    "transforms",
    "verify",
    "workdir",
)

__all__ = [*_EXPORTS, "__version__"]

if TYPE_CHECKING:
    from .build import BuildConfig, BuildResult
    from .build import build as build_pack
    from .compress import CompressConfig, CompressResult
    from .compress import compress as compress_tree
    from .dataset import PackDataset, class_histogram, split
    from .errors import (
        DiskFullError,
        FFmpegError,
        InputError,
        NoUsableImagesError,
        PackBusyError,
        PackerError,
        PackFormatError,
        UsageError,
        WorkerDiedError,
    )
    from .format import Manifest
    from .loader import PackLoader, PackSampler, batch_seed
    from .normalize import Normalize
    from .pack import ImagePack
    from .pack import open_pack as load
    from .show import ShowConfig, ShowResult, show_pack
    from .verify import VerifyConfig, VerifyReport
    from .verify import verify as verify_pack


def __getattr__(name: str) -> Any:
    import importlib

    if name in _SUBMODULES:
        try:
            return importlib.import_module(f"packer.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"packer.{name}":
                raise  # a dependency is missing: say which, not "no attribute"
            raise AttributeError(f"module 'packer' has no attribute {name!r}") from None
    target = _EXPORTS.get(name)
    if target is None:
        raise AttributeError(f"module 'packer' has no attribute {name!r}")
    module, attr = target.split(":")
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value
