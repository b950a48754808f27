"""Benchmark harness: keyedstate vs Spark's built-in state store providers.

``python3 -m benchmarks`` runs every workload x provider pair (each in its own subprocess and
JVM) through pytest-benchmark and writes ``benchmarks/RESULTS.md`` plus ``benchmarks/plots/``.
See ``benchmarks/README.md``.
"""
