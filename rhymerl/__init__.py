"""rhymerl: RL post-training of LLMs that runs fast by using history."""

import os

# torch's CPU matmuls (MKL) in strict conditional-numerical-reproducibility mode: a product does not
# depend on how many threads computed it, so a rollout worker that runs its passes at fewer threads
# on a busy machine (rollout.adaptive_threads) samples the tokens it would have at the configured
# count. MKL reads it at its first call, so it is set before anything computes; a user's value wins.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

__version__ = "0.1.0"
