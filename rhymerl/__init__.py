"""rhymerl: RL post-training of LLMs that runs fast by using history."""

__version__ = "0.1.0"
