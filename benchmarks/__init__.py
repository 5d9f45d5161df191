"""Reproducible benchmarks of seqbal against the older strict Karmarkar-Karp loop.

Run ``python -m benchmarks.run`` from the repository root; see docs/benchmarks.md.
"""
