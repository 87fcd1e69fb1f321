"""Timing tools on one harness (benchmarks/harness.py); see benchmarks/README.md."""
