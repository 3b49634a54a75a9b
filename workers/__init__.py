"""The data plane: what the pods run. The controller's step loop, rollout engines and speculators,
history stores, reward scoring, the trainer, the embedded model and task, run-folder formats."""
