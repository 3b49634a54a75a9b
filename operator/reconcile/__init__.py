"""The Kubernetes operator (`rhymerl operator`): converge each RLJob's children and keep its status.

Pure decisions: validate.py (the spec or its problems), diff.py (desired vs actual -> writes), pods.py
(what pods say, failure counts), conditions.py (phase, conditions, events). I/O: cluster.py (the API),
history.py (Redis cleanup), reconciler.py (one pass of one job), handlers.py (kopf: what wakes a job),
run.py (the process). docs/architecture.md describes how they fit.
"""
