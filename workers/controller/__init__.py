"""The controller: the RL step loop and the bookkeeping around it (prompts, run folder)."""
