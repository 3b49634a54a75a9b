"""Trace-driven rollout simulator that runs the production schedulers (docs/scheduling.md)."""

from .config import SimConfig, SimulationError
from .engine import Simulator, simulate
from .metrics import LowerBound, SimResult, StepRecord, lower_bound

__all__ = ["LowerBound", "SimConfig", "SimResult", "SimulationError", "Simulator", "StepRecord", "lower_bound", "simulate"]
