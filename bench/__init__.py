"""Benchmarks and tools around the pipeline: `python -m bench` lists them, `python -m
bench.<tool>` runs one; bench.common holds what they share. A tool whose question is settled
leaves bench/; its sitting files and the docs name the command and commit that ran it."""
