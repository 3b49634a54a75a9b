"""The distributed runtime: the step loop's role workers as Ray actors (ray_transport.py; the step
loop over them and what ended a run, ray_backend.py), how they are placed on the pods of a cluster
or on this machine (cluster.py), a pod's Ray node (node.py), what a pod runs (`rhymerl worker`: the
member pods' supervisor, pod_supervisor.py; the controller pod's head and step loop,
controller_pod.py), its endpoints (endpoints.py), its model fetch (fetch*.py), the GPU preflight
(gpu_preflight.py), and the watchdog that makes a run's Ray processes die with it (reaper.py)."""
