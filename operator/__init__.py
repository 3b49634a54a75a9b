"""The control plane: turns RLJobs into Kubernetes objects (`manifests`, pure) and keeps them
converged (`reconcile`, kopf); `progress` is the one status write the controller pod makes."""
