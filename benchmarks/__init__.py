"""The maintained benchmarks: one package, one entry point (``python -m benchmarks.run``).

Each module runs alone as ``python -m benchmarks.NAME`` from the repository root, measures
its baseline in the same run and prints a table; what they share is in
:mod:`benchmarks._common`. Figures and the commands that made them: docs/PERFORMANCE.md.
"""
