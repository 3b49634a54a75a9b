"""The control plane: turns RLJobs into Kubernetes objects and keeps them converged; also the local backend."""
