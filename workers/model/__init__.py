"""The embedded default model: a tiny Llama-style decoder and its character tokenizer."""
