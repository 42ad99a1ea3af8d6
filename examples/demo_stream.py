"""`python examples/demo_stream.py ...` in a checkout: the script is packer/examples/demo_stream.py,
shipped in the wheel (`python -m packer.examples.demo_stream ...`)."""

import runpy

runpy.run_module("packer.examples.demo_stream", run_name="__main__", alter_sys=True)
