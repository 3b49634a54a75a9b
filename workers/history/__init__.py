"""History stores: last epoch's responses per prompt, kept and shipped as serialised indexes.

The index itself is a pure library, `rhymerl.algorithms.drafting`.
"""
