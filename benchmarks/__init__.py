"""Reproducible benchmarks of seqbal against the older strict Karmarkar-Karp loop.

Run ``python -m benchmarks.run`` from the repository root; see docs/benchmarks.md (results) and docs/benchmarks_method.md (method, full grid).
"""
