"""Rule-based rewards: built-in verifiers and user functions named in the RLJob."""
