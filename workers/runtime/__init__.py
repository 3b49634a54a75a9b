"""The distributed runtime: the step loop with each role a Ray worker (ray_loop.py), the workers
(actors.py), and how they are placed on the pods of a cluster or on this machine (cluster.py)."""
