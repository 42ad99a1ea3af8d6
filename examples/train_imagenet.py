"""`python examples/train_imagenet.py ...` in a checkout: the script is packer/examples/train_imagenet.py,
shipped in the wheel (`python -m packer.examples.train_imagenet ...`)."""

import runpy

runpy.run_module("packer.examples.train_imagenet", run_name="__main__", alter_sys=True)
