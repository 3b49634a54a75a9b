"""The role workers: rollout, reward, train and history, plain classes that run in the step loop's
process (`backend: local`) or as Ray actors, one per pod of the role (`backend: ray`, a cluster).
The same classes do the same work either way; only how they are reached differs
(workers/controller/transport.py). Bulk data (responses, weights, indexes) passes between them,
never through the step loop, which sees summaries (samples.py)."""
