"""Benchmarks: each module exposes ``run() -> dict[str, float]`` and prints its own figures.

Figures are ratios against the bare-process limit measured in the same run, so they mean the same on
any machine. Timings are reported, never asserted.
"""
