"""History: last epoch's responses per prompt, indexed so rollout workers can draft from them (HistoSpec).

`index` holds the native reward-aware suffix index and the batched AIMD drafter; stores that keep
and ship serialised indexes live beside it.
"""

from rhymerl.workers.history.index import HistoryDrafter, HistoryIndex, IndexFormatError, IndexStats

__all__ = ["HistoryDrafter", "HistoryIndex", "IndexFormatError", "IndexStats"]
