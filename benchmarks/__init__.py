"""Tier benchmark suite: trace replay through the real cache classes, workload generators, sweeps, cost model.

Run `python -m benchmarks --help`. Results and the exact commands behind them are in benchmarks/RESULTS.md.
"""
