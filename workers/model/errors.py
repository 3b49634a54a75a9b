"""ModelError in a module of its own: folder.py's model_dir imports the GGUF importer and the downloadable
builtins lazily, and they raise ModelError, so it cannot live in folder.py without an import cycle
(folder.py re-exports it: `from rhymerl.workers.model.folder import ModelError` still works)."""

from __future__ import annotations

from rhymerl.errors import UserError


class ModelError(UserError):
    """A model folder that cannot be used; the message names the file."""
