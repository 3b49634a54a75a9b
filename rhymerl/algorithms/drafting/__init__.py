"""HistoSpec drafting as a pure library: the native reward-aware suffix index over last epoch's
responses, its batched AIMD drafter, and the adaptive draft cap.

`_suffix_index` (C++) is private: only `index` imports it.
"""

from rhymerl.algorithms.drafting.index import (
    AimdWindows,
    GroupIndex,
    HistoryDrafter,
    HistoryIndex,
    IndexFormatError,
    IndexStats,
    ngram_draft,
)

__all__ = ["AimdWindows", "GroupIndex", "HistoryDrafter", "HistoryIndex", "IndexFormatError", "IndexStats", "ngram_draft"]
