"""Pure algorithm libraries: the ideas of the papers as code that does no I/O.

`drafting` (HistoSpec: the native suffix index, AIMD windows, the adaptive draft cap),
`scheduling` (HistoPipe: ranking, tiering, migration, stealing, the batching model and the
executor of scheduler actions), `objectives` (GRPO/DAPO loss math). Workers and offline tools
import them; they import nothing above `rhymerl.api`.
"""
