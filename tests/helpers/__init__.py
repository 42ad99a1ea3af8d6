"""Test rigs the suite and the benchmarks share (not part of the product): the S3 server."""
