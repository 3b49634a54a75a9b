"""The run folder: spec, metrics rows, rollout dumps' place, checkpoints, plots, its lock
(docs/formats.md). Read and written by the step loop and the train worker; nothing here runs a step."""
