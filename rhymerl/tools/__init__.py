"""Offline tools that no pod runs: the trace-driven simulator, trace readers and writers, the
benches, and the embedded model's pretraining."""
