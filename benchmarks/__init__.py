"""Benchmarks: each module measures one claim and writes its numbers under benchmarks/results/."""
