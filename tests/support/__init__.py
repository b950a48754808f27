"""Shared test support: constants, the deterministic query driver, the operator scenarios,
process helpers and JVM-layer access. Tests import from here, never from each other."""
