"""Benchmarks behind ``elasticps bench ...``; each prints JSON."""
