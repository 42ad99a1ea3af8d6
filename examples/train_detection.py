"""`python examples/train_detection.py ...` in a checkout: the script is packer/examples/train_detection.py,
shipped in the wheel (`python -m packer.examples.train_detection ...`)."""

import runpy

runpy.run_module("packer.examples.train_detection", run_name="__main__", alter_sys=True)
