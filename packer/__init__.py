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
raise are ``PackerError`` and its subclasses. ``packer.configure_cuda_queues()``, called
before the first CUDA call, gives a JPEG loader's GPU decodes CUDA's 32 hardware queues
(``import packer`` itself changes nothing in the process). ``packer.builder``,
``packer.compress``, ``packer.transforms`` and the stage packages (``packer.pack``,
``packer.sources``, ``packer.imaging``, ``packer.augment``, ``packer.loading``, ``packer.measure``) are
always modules, never functions. Everything below the stage packages is private:
import the names above, not the modules that define them.

Names are imported lazily, so ``imgpack --help`` and build workers stay light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._lazy import lazy_getattr as _lazy_getattr
from ._version import __version__
from .pack.guard import install as _install_tensordict_guard

# ``import packer`` leaves os.environ as it is: CUDA's hardware queues for the JPEG
# decoders are asked for by ``packer.configure_cuda_queues()`` (or a JPEG loader on CUDA)
# tensordict's loaders refuse an untrusted pack from here on, whatever imports tensordict
# and whenever (standard library only: no torch import): see packer.pack.guard
_install_tensordict_guard()

_EXPORTS = {
    "load": "packer.storage.open:load",
    "ImagePack": "packer.pack.reader:ImagePack",
    "PackSet": "packer.storage.packset:PackSet",
    "PackLoader": "packer.loading.loader:PackLoader",
    "PackSampler": "packer.loading.sampler:PackSampler",
    "batch_seed": "packer.loading.order:batch_seed",
    "StatsConfig": "packer.loading.stats:StatsConfig",
    "LoaderStats": "packer.loading.stats:LoaderStats",
    "Normalize": "packer.imaging.normalize:Normalize",
    "PackDataset": "packer.loading.dataset:PackDataset",
    "split": "packer.loading.dataset:split",
    "class_histogram": "packer.loading.dataset:class_histogram",
    "build_pack": "packer.builder.api:build",
    "BuildConfig": "packer.builder.config:BuildConfig",
    "BuildResult": "packer.builder.config:BuildResult",
    "compress_tree": "packer.compress:compress",
    "CompressConfig": "packer.compress:CompressConfig",
    "CompressResult": "packer.compress:CompressResult",
    "verify_pack": "packer.measure.verify_pack:verify_pack",
    "VerifyConfig": "packer.measure.verify:VerifyConfig",
    "VerifyReport": "packer.measure.verify:VerifyReport",
    "show_pack": "packer.measure.show:show_pack",
    "ShowConfig": "packer.measure.show:ShowConfig",
    "ShowResult": "packer.measure.show:ShowResult",
    "Manifest": "packer.pack.schema:Manifest",
    "PackerError": "packer.errors:PackerError",
    "UsageError": "packer.errors:UsageError",
    "InputError": "packer.errors:InputError",
    "PackFormatError": "packer.errors:PackFormatError",
    "PackBusyError": "packer.errors:PackBusyError",
    "DiskFullError": "packer.errors:DiskFullError",
    "WorkerDiedError": "packer.errors:WorkerDiedError",
    "NoUsableImagesError": "packer.errors:NoUsableImagesError",
    "FFmpegError": "packer.errors:FFmpegError",
    "StorageError": "packer.errors:StorageError",
    "configure_cuda_queues": "packer.imaging.cuda_queues:configure",
}

# ``packer.<name>`` for these is the module, importable without an import statement
# first (so ``packer.builder`` is never an AttributeError one moment and a module the next).
_SUBMODULES = (
    "augment",
    "builder",  # the writer (its ``api.build`` is ``packer.build_pack``)
    "cli",
    "compress",
    "errors",
    "imaging",
    "loading",
    "measure",
    "pack",
    "sources",
    "storage",
    "transforms",
)

__all__ = [*_EXPORTS, "__version__"]

if TYPE_CHECKING:
    from .builder.api import build as build_pack
    from .builder.config import BuildConfig, BuildResult
    from .compress import CompressConfig, CompressResult
    from .compress import compress as compress_tree
    from .errors import (
        DiskFullError,
        FFmpegError,
        InputError,
        NoUsableImagesError,
        PackBusyError,
        PackerError,
        PackFormatError,
        StorageError,
        UsageError,
        WorkerDiedError,
    )
    from .imaging.cuda_queues import configure as configure_cuda_queues
    from .imaging.normalize import Normalize
    from .loading.dataset import PackDataset, class_histogram, split
    from .loading.loader import PackLoader
    from .loading.order import batch_seed
    from .loading.sampler import PackSampler
    from .measure.show import ShowConfig, ShowResult, show_pack
    from .measure.verify import VerifyConfig, VerifyReport
    from .measure.verify_pack import verify_pack
    from .pack.reader import ImagePack
    from .pack.schema import Manifest
    from .storage.open import load
    from .storage.packset import PackSet


__getattr__ = _lazy_getattr(__name__, _EXPORTS, _SUBMODULES)
