"""imgpack: pack an image folder into a memory-mapped tensordict and stream it to the GPU.

    import packer
    pack = packer.load("tensors/")            # ImagePack: images uint8 [N,3,H,W], labels int64 [N]
    loader = packer.PackLoader(pack, 256, device="cuda")
    model = torch.nn.Sequential(packer.Normalize(), net)
    for images, labels in loader: ...

Also ``packer.build_pack``, ``packer.compress_tree`` and ``packer.verify_pack``
(the library behind the three commands; the submodules ``packer.build`` etc.
hold them too). Names are imported lazily, so ``imgpack --help`` and build workers stay light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

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
    "compress_tree": "packer.compress:compress",
    "CompressConfig": "packer.compress:CompressConfig",
    "verify_pack": "packer.verify:verify",
    "VerifyConfig": "packer.verify:VerifyConfig",
    "PackerError": "packer.errors:PackerError",
}

__all__ = [*_EXPORTS, "__version__"]

if TYPE_CHECKING:
    from .build import BuildConfig
    from .build import build as build_pack
    from .compress import CompressConfig
    from .compress import compress as compress_tree
    from .dataset import PackDataset, class_histogram, split
    from .errors import PackerError
    from .loader import PackLoader, PackSampler, batch_seed
    from .normalize import Normalize
    from .pack import ImagePack
    from .pack import open_pack as load
    from .verify import VerifyConfig
    from .verify import verify as verify_pack


def __getattr__(name: str) -> Any:
    target = _EXPORTS.get(name)
    if target is None:
        raise AttributeError(f"module 'packer' has no attribute {name!r}")
    import importlib

    module, attr = target.split(":")
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value
