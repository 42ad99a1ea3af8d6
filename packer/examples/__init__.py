"""Runnable examples, shipped in the wheel: ``python -m packer.examples.NAME --help``.

train_imagenet   torchvision's classification recipe on packs (DDP under torchrun:
                 ``torchrun --nproc-per-node 8 -m packer.examples.train_imagenet ...``)
train_sets_ddp   a pack set under DDP, with an elastic resume on another world size
demo_stream      stream a pack to the GPU (or the CPU) and normalize there

The repository's ``examples/NAME.py`` run the same code (``python examples/NAME.py``).
"""
