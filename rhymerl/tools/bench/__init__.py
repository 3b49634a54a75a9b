"""Benchmark implementations behind `rhymerl bench` (tables, plots, JSON results)."""
