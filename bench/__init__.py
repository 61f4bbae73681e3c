"""Benchmarks and tools around the pipeline: `python -m bench` lists them, `python -m
bench.<tool>` runs one; bench.common holds what they share."""
