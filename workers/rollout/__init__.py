"""Rollout: engines that generate responses, and the sampling rule that makes speculation lossless."""
