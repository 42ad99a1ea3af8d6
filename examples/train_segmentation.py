"""`python examples/train_segmentation.py ...` in a checkout: the script is packer/examples/train_segmentation.py,
shipped in the wheel (`python -m packer.examples.train_segmentation ...`)."""

import runpy

runpy.run_module("packer.examples.train_segmentation", run_name="__main__", alter_sys=True)
