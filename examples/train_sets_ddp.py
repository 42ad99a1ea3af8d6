"""`python examples/train_sets_ddp.py ...` in a checkout: the script is packer/examples/train_sets_ddp.py,
shipped in the wheel (`python -m packer.examples.train_sets_ddp ...`)."""

import runpy

runpy.run_module("packer.examples.train_sets_ddp", run_name="__main__", alter_sys=True)
