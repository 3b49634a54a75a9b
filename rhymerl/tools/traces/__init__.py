"""Workload traces: `step,prompt_id,input_len,output_len` rows, one per sampled response.

Traces drive the scheduling simulator. They come from other systems' CSV files, from our own run
dumps (`rhymerl trace export`), or from a synthetic generator calibrated to published figures.
"""

from .io import TraceError, read_trace, write_trace
from .model import IdKind, Trace
from .stability import StabilityReport, rank_stability
from .synthetic import PRESETS, SyntheticConfig, generate, load_trace, synthetic

__all__ = [
    "PRESETS",
    "IdKind",
    "StabilityReport",
    "SyntheticConfig",
    "Trace",
    "TraceError",
    "generate",
    "load_trace",
    "rank_stability",
    "read_trace",
    "synthetic",
    "write_trace",
]
