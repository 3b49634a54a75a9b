"""The distributed runtime: the step loop's role workers as Ray actors (ray_transport.py), how
they are placed on the pods of a cluster or on this machine (cluster.py), a pod's Ray node
(node.py), its endpoints (endpoints.py), and the watchdog that makes a run's Ray processes die
with it (reaper.py)."""
