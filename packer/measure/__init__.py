"""Measuring a pack: ``verify`` (integrity and throughput against the folder), the
folder baseline, the one clock, plots, and ``imgpack bench``."""
