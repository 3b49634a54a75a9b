"""One data row, as the ecosystem writes it, read into a Prompt; and the rows of parquet/arrow files.

veRL's parquet rows (`prompt` as chat messages, `reward_model.ground_truth`, `data_source`,
`extra_info.index`), TRL's `messages` column (a trailing assistant turn is the reference
completion, not prompt) and rhymerl's own `prompt`/`answer` rows are all accepted, so a data set
prepared for either library needs no conversion. Tables are read with pyarrow, a Hugging Face
`save_to_disk` folder included, without the `datasets` library.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from rhymerl.errors import UserError
from rhymerl.workers.model.chat_template import Message
from rhymerl.workers.model.folder import read_json

ROLES = ("system", "user", "assistant", "tool")
NONE_HELP = ("data.chatTemplate: none, but the row's prompt is chat messages; set data.chatTemplate: auto (the "
             "model's chat template renders them) or write the prompt as a string")


def _messages(value: object, where: str, field: str, error: type[UserError]) -> tuple[Message, ...]:
    if not isinstance(value, list) or not value:
        raise error(f"{where}: {field}: must be a non-empty list of {{role, content}} messages")
    out: list[Message] = []
    for i, m in enumerate(value):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise error(f"{where}: {field}[{i}]: must be an object with string 'role' and 'content'")
        if m["role"] not in ROLES:
            raise error(f"{where}: {field}[{i}]: role '{m['role']}' is not one of {', '.join(ROLES)}")
        out.append((m["role"], m["content"]))
    return tuple(out)


def _answer(row: Mapping[str, Any], where: str, error: type[UserError]) -> str:
    if "answer" in row:
        if not isinstance(row["answer"], str):
            raise error(f"{where}: 'answer' must be a string")
        return row["answer"]
    reward_model = row.get("reward_model")
    truth = reward_model.get("ground_truth") if isinstance(reward_model, Mapping) else None
    if not isinstance(truth, str):
        raise error(f"{where}: no answer: needs 'answer' or veRL's 'reward_model.ground_truth' as a string")
    return truth


def read_prompt(row: Mapping[str, Any], where: str,
                error: type[UserError]) -> tuple[str, tuple[Message, ...] | None, str]:
    """(text, messages, answer) of a row. A chat prompt's text is its last user message, for display:
    the model reads the messages rendered by its template."""
    if "prompt" in row:
        if isinstance(row["prompt"], str):
            return row["prompt"], None, _answer(row, where, error)
        messages = _messages(row["prompt"], where, "prompt", error)
    elif "messages" in row:
        messages = _messages(row["messages"], where, "messages", error)
        if messages[-1][0] == "assistant":
            messages = messages[:-1]
        if not messages:
            raise error(f"{where}: messages: only an assistant turn; a prompt needs a user message")
    else:
        raise error(f"{where}: no prompt: needs 'prompt' (a string or chat messages) or TRL's 'messages'")
    users = [content for role, content in messages if role == "user"]
    return (users[-1] if users else messages[-1][1]), messages, _answer(row, where, error)


def extras(row: Mapping[str, Any], where: str, error: type[UserError]) -> tuple[str | None, dict[str, Any] | None]:
    """veRL's `data_source` and `extra_info`, passed on to a reward function that asks for them."""
    source, info = row.get("data_source"), row.get("extra_info")
    if source is not None and not isinstance(source, str):
        raise error(f"{where}: data_source: must be a string")
    if info is not None and not isinstance(info, Mapping):
        raise error(f"{where}: extra_info: must be an object")
    return source, (dict(info) if info is not None else None)


def is_table(path: Path) -> bool:
    return path.suffix in (".parquet", ".arrow") or (path.is_dir() and (path / "state.json").is_file())


def table_rows(path: Path, error: type[UserError]) -> Iterator[tuple[Path, int, dict[str, Any]]]:
    """(file, row number in it from 1, row) of a parquet file, an arrow file or a `save_to_disk`
    folder (its state.json lists the arrow files, in order)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = [path]
    if path.is_dir():
        state = read_json(path / "state.json")
        names = [f.get("filename") for f in state.get("_data_files", [])] if isinstance(state, dict) else []
        if not names or not all(isinstance(n, str) for n in names):
            raise error(f"{path / 'state.json'}: _data_files: no arrow files listed")
        files = [path / str(n) for n in names]
    for f in files:
        try:
            table = pq.read_table(f) if f.suffix == ".parquet" else _arrow_table(f)
        except (OSError, pa.ArrowException) as exc:
            raise error(f"{f}: not a readable {f.suffix.lstrip('.') or 'arrow'} table ({exc})") from None
        for n, row in enumerate(table.to_pylist(), 1):
            yield f, n, row


def _arrow_table(path: Path) -> Any:
    """An arrow IPC file in either layout: the stream `save_to_disk` writes, or the random-access file."""
    import pyarrow as pa

    with pa.memory_map(str(path)) as source:
        try:
            return pa.ipc.open_stream(source).read_all()
        except pa.ArrowInvalid:
            source.seek(0)
            return pa.ipc.open_file(source).read_all()
