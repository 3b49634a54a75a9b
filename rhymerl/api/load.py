"""Read an RLJob from YAML into the validated spec, with errors a person can act on.

Every problem is reported as ``field.path: reason (line N)``, the path in the file's own spelling: a
field may be written camelCase (``maxReplicas``, the CRD's) or snake_case (``max_replicas``), not both
in one mapping; unknown keys come with the closest known key in the spelling the key uses. `--set a.b=c` overrides are applied to the raw document before validation so they are
checked exactly like the file, and a problem in an overridden field names the `--set` item.

A spec file is untrusted input: the loader reads bytes and insists on UTF-8, refuses duplicate
keys (YAML would silently keep the last), caps what aliases may expand to and how deep nesting
goes (a "billion laughs" document fails at its alias instead of hanging), and refuses an empty
document, which would otherwise run the default job. A valid job is then held to the sizes the API
server and etcd take of the objects it becomes (`size_problems`), and a `--set` item shows in a message
with any credential in it masked (rhymerl.api.credentials).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from rhymerl.api.credentials import masked_set_item
from rhymerl.api.k8s_values import MAX_CONFIG_MAP_BYTES, MAX_OBJECT_BYTES, json_bytes, yaml_bytes_bound
from rhymerl.api.roles import ROLES
from rhymerl.api.spec import API_VERSION, KIND, RLJob
from rhymerl.api.spelling import camel_text, field_of, inner_model
from rhymerl.errors import UserError

# An RLJob is a few KB; Kubernetes refuses objects past ~1.5 MiB (etcd's request limit).
MAX_SPEC_BYTES = 1 << 20
# Nodes that aliases may add, counted as if every alias were written out; a whole RLJob has ~200.
MAX_ALIAS_NODES = 10_000
# The spec nests 5 levels; far deeper is not a spec, and deep enough nesting overflows the parser.
MAX_DEPTH = 64
MERGE_TAG = "tag:yaml.org,2002:merge"


@dataclass(frozen=True)
class SpecProblem:
    path: str
    reason: str
    line: int | None = None
    origin: str | None = None  # the `--set key=value` item that set this field, if one did

    def __str__(self) -> str:
        if self.origin is not None:
            return f"{self.path}: {self.reason} (--set {self.origin})"
        where = f" (line {self.line})" if self.line is not None else ""
        return f"{self.path}: {self.reason}{where}"


class SpecError(UserError):
    """A spec that cannot be used; carries every problem found, not just the first."""

    def __init__(self, problems: list[SpecProblem], source: str = "") -> None:
        self.problems = problems
        self.source = source
        head = f"{source}: " if source else ""
        super().__init__(head + "; ".join(str(p) for p in problems))


class _Refused(yaml.MarkedYAMLError):
    """A document the guarded loader will not build, marked at the node that broke a limit."""

    def __init__(self, problem: str, mark: Any) -> None:  # a yaml.error.Mark or the C parser's Mark
        super().__init__(problem=problem, problem_mark=mark)


class _GuardedLoader(yaml.SafeLoader):
    """SafeLoader with a budget, enforced while composing and so before any object is built:
    aliases may add at most MAX_ALIAS_NODES nodes, nesting stops at MAX_DEPTH, and an alias
    inside its own anchor (a recursive document) is refused."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._alias_nodes = 0
        self._depth = 0
        self._sizes: dict[int, int] = {}
        self._done: set[int] = set()

    def _size(self, node: yaml.Node) -> int:
        """Nodes under `node` with every alias written out; memoised, so linear in the graph."""
        key = id(node)
        if key not in self._sizes:
            if isinstance(node, yaml.MappingNode):
                self._sizes[key] = 1 + sum(self._size(k) + self._size(v) for k, v in node.value)
            elif isinstance(node, yaml.SequenceNode):
                self._sizes[key] = 1 + sum(self._size(item) for item in node.value)
            else:
                self._sizes[key] = 1
        return self._sizes[key]

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event: yaml.AliasEvent = self.peek_event()  # type: ignore[no-untyped-call]  # PyYAML ships no annotations
            target = self.anchors.get(event.anchor)
            if target is not None:
                if id(target) not in self._done:
                    raise _Refused(f"alias *{event.anchor} is used inside its own anchor (a recursive document)",
                                   event.start_mark)
                self._alias_nodes += self._size(target)
                if self._alias_nodes > MAX_ALIAS_NODES:
                    raise _Refused(f"aliases expand to more than {MAX_ALIAS_NODES} nodes at *{event.anchor}; "
                                   "an RLJob has a few hundred (an alias bomb?)", event.start_mark)
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _Refused(f"nested deeper than {MAX_DEPTH} levels", self.peek_event().start_mark)  # type: ignore[no-untyped-call]
        node = super().compose_node(parent, index)
        self._depth -= 1
        self._done.add(id(node))
        return node


def _walk(root: yaml.Node) -> tuple[dict[tuple[str, ...], int], list[SpecProblem]]:
    """The line of every key path, and every key written twice in one mapping. A node reached
    through several aliases is walked once, at its first path, so the walk is linear in the file."""
    lines: dict[tuple[str, ...], int] = {}
    duplicates: list[SpecProblem] = []
    seen: set[int] = set()

    def walk(node: yaml.Node, path: tuple[str, ...]) -> None:
        if id(node) in seen:
            return
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first: dict[tuple[str, str], int] = {}
            for key, value in node.value:
                if key.tag == MERGE_TAG:
                    continue
                sub = (*path, str(key.value))
                line = key.start_mark.line + 1
                if isinstance(key, yaml.ScalarNode):
                    ident = (key.tag, key.value)
                    if ident in first:
                        duplicates.append(SpecProblem(".".join(sub), f"duplicate key (first on line {first[ident]})",
                                                      line))
                    else:
                        first[ident] = line
                lines.setdefault(sub, line)
                walk(value, sub)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                sub = (*path, str(i))
                lines.setdefault(sub, item.start_mark.line + 1)
                walk(item, sub)

    walk(root, ())
    return lines, duplicates


def _yaml_problem(exc: yaml.YAMLError, text: str) -> SpecProblem:
    if isinstance(exc, yaml.reader.ReaderError):
        # raised for control characters; its own message spans lines and counts characters
        at = text.count("\n", 0, exc.position) + 1
        return SpecProblem("(yaml)", f"character U+{exc.character:04X} is not allowed in YAML", at)
    mark = getattr(exc, "problem_mark", None)
    line = mark.line + 1 if mark is not None else None
    reason = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return SpecProblem("(yaml)", str(reason), line)


@dataclass
class _Document:
    data: Any
    lines: dict[tuple[str, ...], int]
    duplicates: list[SpecProblem]


def _load_yaml(text: str) -> _Document:
    """One YAML document under the loader's limits; raises yaml.YAMLError (or ValueError for a
    scalar Python refuses, e.g. an integer of more than 4300 digits)."""
    loader = _GuardedLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return _Document(None, {}, [])
        lines, duplicates = _walk(root)
        return _Document(loader.construct_document(root), lines, duplicates)
    finally:
        loader.dispose()


def safe_load(text: str) -> Any:
    """yaml.safe_load under the same limits as spec files (aliases, depth)."""
    return _load_yaml(text).data


def safe_load_all(text: str) -> list[Any]:
    """Every document of a YAML stream, each under the limits of safe_load (empty ones left out)."""
    return [doc for doc in yaml.load_all(text, Loader=_GuardedLoader) if doc is not None]


def decode(data: bytes, source: str) -> str:
    """UTF-8 text of a spec file, or a SpecError naming the line and column of the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        problem = SpecProblem("(file)", f"not UTF-8: byte 0x{data[exc.start]:02x} at column {column}", line)
        raise SpecError([problem], source) from None


def _model_at(path: tuple[str | int, ...]) -> type[BaseModel] | None:
    """The pydantic model that owns the last key of `path` (either spelling), for suggesting spellings."""
    model: type[BaseModel] = RLJob
    for key in path[:-1]:
        if isinstance(key, int) or key.isdigit():
            continue  # a list item: the list's model
        name = field_of(model, key)
        inner = None if name is None else inner_model(model.model_fields[name].annotation)
        if inner is None:
            return None
        model = inner
    return model


def _spellings(model: type[BaseModel], mapping: dict[Any, Any]) -> tuple[int, int]:
    """How many of `mapping`'s keys spell a field of `model` by its camelCase alias, and how many by its
    snake_case name (a field whose two spellings are one word counts for neither)."""
    camel = snake = 0
    for key in mapping:
        name = field_of(model, str(key))
        alias = None if name is None else model.model_fields[name].alias
        if name is not None and alias is not None and alias != name:
            camel += key == alias
            snake += key == name
    return camel, snake


def _document_camel(doc: Any) -> bool:
    """Whether the document spells its fields camelCase: by most of its keys that say, camelCase when none do
    (the CRD's spelling, and the operator's: the API server stores the job by the CRD)."""
    camel = snake = 0
    pending: list[tuple[type[BaseModel], Any]] = [(RLJob, doc)]
    while pending:
        model, data = pending.pop()
        if isinstance(data, list):
            pending += [(model, item) for item in data]
            continue
        if not isinstance(data, dict):
            continue
        c, s = _spellings(model, data)
        camel, snake = camel + c, snake + s
        for key, value in data.items():
            name = field_of(model, str(key))
            inner = None if name is None else inner_model(model.model_fields[name].annotation)
            if inner is not None:
                pending.append((inner, value))
    return camel >= snake


def _as_written(loc: tuple[str | int, ...], doc: Any) -> tuple[tuple[str, ...], bool]:
    """`loc` (pydantic's, or a validator's field names appended to it) in the document's own keys: each
    field by the spelling the document gives it; one it does not give, in the spelling of the mapping
    around it, else of the document. Second: whether the path reads camelCase."""
    model: type[BaseModel] | None = RLJob
    node, out, camel = doc, [], None
    for part in loc:
        if isinstance(part, int) or part.isdigit():
            out.append(str(part))
            index = int(part)
            node = node[index] if isinstance(node, list) and index < len(node) else None
            continue
        name = None if model is None else field_of(model, part)
        if model is None or name is None:
            out.append(part)
            node, model = node.get(part) if isinstance(node, dict) else None, None
            continue
        alias = model.model_fields[name].alias or name
        mapping = node if isinstance(node, dict) else {}
        if part in mapping or name in mapping or alias in mapping:
            written = part if part in mapping else name if name in mapping else alias
        else:
            here_camel, here_snake = _spellings(model, mapping)
            if here_camel != here_snake:
                camel = here_camel > here_snake
            elif camel is None:
                camel = _document_camel(doc)
            written = alias if camel else name
        if alias != name:
            camel = written == alias
        out.append(written)
        node, model = mapping.get(written), inner_model(model.model_fields[name].annotation)
    return tuple(out), _document_camel(doc) if camel is None else camel


def _origin(loc: tuple[str, ...], origins: dict[tuple[str, ...], str]) -> str | None:
    """The --set item that wrote `loc` or a mapping above it."""
    for n in range(len(loc), 0, -1):
        item = origins.get(loc[:n])
        if item is not None:
            return item
    return None


def _unknown(key: str, owner: type[BaseModel] | None, camel: bool) -> str:
    """Why `key` is refused: a field spelled both ways in one mapping, or a key no field has (with the
    closest field, spelled in the key's own style)."""
    name = None if owner is None else field_of(owner, key)
    if owner is not None and name is not None:
        other = owner.model_fields[name].alias if key == name else name
        return f"given twice, as {key} and as {other}: keep one"
    fields = owner.model_fields if owner is not None else {}
    if "_" in key or key != key.lower():
        camel = "_" not in key
    known = [(f.alias or n) if camel else n for n, f in fields.items()]
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return "unknown field" + (f"; did you mean '{close[0]}'?" if close else "")


def problems_from(error: ValidationError, lines: dict[tuple[str, ...], int],
                  origins: dict[tuple[str, ...], str] | None = None, doc: Any = None) -> list[SpecProblem]:
    """Each of pydantic's errors as a SpecProblem naming the field as `doc` (the document validated) writes
    it, with the line `lines` gives for it or the `--set` item of `origins` that set it."""
    problems = []
    for item in error.errors():
        loc = tuple(item["loc"])
        reason = item["msg"]
        if reason.startswith("Value error, "):
            reason = reason.removeprefix("Value error, ")
            # validators name the offending field first: "max_replicas: must be >= min_replicas" (or
            # a path below the validated model: "rollout.engine: ...")
            field, sep, rest = reason.partition(": ")
            if sep and all(part.isidentifier() or part.isdigit() for part in field.split(".")):
                loc = (*loc, *field.split("."))
                reason = rest
        keys, camel = _as_written(loc, doc)
        if item["type"] == "extra_forbidden":
            reason = _unknown(keys[-1], _model_at(loc), camel)
        elif camel:
            reason = camel_text(reason)  # validators name fields by their snake_case names
        path = ".".join(keys) or "(document)"
        origin = _origin(keys, origins or {})
        line = None
        if origin is None:
            for n in range(len(keys), 0, -1):
                line = lines.get(keys[:n])
                if line is not None:
                    break
        problems.append(SpecProblem(path, reason, line, origin))
    return problems


def _parse_value(raw: str) -> Any:
    try:
        return safe_load(raw)
    except (yaml.YAMLError, ValueError):
        return raw


def _key_for(node: dict[str, Any], model: type[BaseModel] | None, key: str) -> str:
    """The key `node` already has for the field `key` spells (in either spelling), else `key`."""
    name = None if model is None else field_of(model, key)
    if model is None or name is None:
        return key
    alias = model.model_fields[name].alias or name
    return next((k for k in (key, alias, name) if k in node), key)


def apply_overrides(doc: dict[str, Any], overrides: list[str]) -> dict[tuple[str, ...], str]:
    """Apply `key.path=value` overrides to `doc` in place; paths are relative to `spec` unless they
    start with a top-level key, and each key may be spelled either way, whichever the file uses. Returns
    the key path each item set, in the document's keys, mapped to the item."""
    origins: dict[tuple[str, ...], str] = {}
    for given in overrides:
        key, sep, raw = given.partition("=")
        value = _parse_value(raw)
        item = masked_set_item(given, value)  # what messages may show of it
        if not sep or not key or "://" in key or "@" in key:
            raise SpecError([SpecProblem(item or "--set", "expected key.path=value", origin=item)], "--set")
        parts = key.split(".")
        if parts[0] not in RLJob.model_fields:
            parts = ["spec", *parts]
        node, written = doc, []
        model: type[BaseModel] | None = RLJob
        for part in parts[:-1]:
            part = _key_for(node, model, part)
            written.append(part)
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                path = ".".join(written)
                raise SpecError([SpecProblem(path, "not a mapping, cannot set a key under it", origin=item)], "--set")
            name = None if model is None else field_of(model, part)
            model = None if model is None or name is None else inner_model(model.model_fields[name].annotation)
            node = child
        node.pop(_key_for(node, model, parts[-1]), None)  # the file's value, in whichever spelling
        node[parts[-1]] = value
        origins[(*written, parts[-1])] = item
    return origins


def parse_job(text: str | bytes, source: str = "", overrides: list[str] | None = None) -> RLJob:
    """Validate an RLJob document; raises SpecError listing every problem found."""
    if isinstance(text, bytes):
        text = decode(text, source)
    try:
        parsed = _load_yaml(text)
    except yaml.YAMLError as exc:
        raise SpecError([_yaml_problem(exc, text)], source) from None
    except ValueError as exc:
        raise SpecError([SpecProblem("(yaml)", str(exc))], source) from None
    doc = parsed.data
    if doc is None:
        raise SpecError([SpecProblem("(document)", f"empty RLJob: write at least apiVersion: {API_VERSION} and "
                                                   f"kind: {KIND}")], source)
    if not isinstance(doc, dict):
        raise SpecError([SpecProblem("(document)", "expected a mapping with apiVersion, kind, metadata, spec")],
                        source)
    problems = list(parsed.duplicates)
    problems += [SpecProblem(key, f"required: write {key}: {value}") for key, value in
                 (("apiVersion", API_VERSION), ("kind", KIND)) if key not in doc]
    origins = apply_overrides(doc, overrides or [])
    try:
        job = RLJob.model_validate(doc)
    except ValidationError as exc:
        raise SpecError(problems + problems_from(exc, parsed.lines, origins, doc), source) from exc
    problems += size_problems(job, parsed.lines)
    if problems:
        raise SpecError(problems, source)
    return job


def load_job(path: str | Path, overrides: list[str] | None = None) -> RLJob:
    p = Path(path)
    try:
        with p.open("rb") as f:
            data = f.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        raise SpecError([SpecProblem("(file)", exc.strerror or str(exc))], str(p)) from None
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError([SpecProblem("(file)", f"larger than {MAX_SPEC_BYTES >> 20} MiB; an RLJob is a few KB")],
                        str(p))
    return parse_job(data, str(p), overrides)


def dump_job(job: RLJob) -> str:
    """The fully resolved job as YAML (every default spelled out), its fields camelCase as in the CRD;
    parse_job(dump_job(j)) == j."""
    return _dump(job.model_dump(mode="json", by_alias=True))


def _dump(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False)


# A role's StatefulSet besides the user's pod overrides: about 6 KB rendered, with room for the spot
# options, images, sources and pull secrets at their bounds.
OPERATOR_POD_BYTES = 64 << 10
# What the ConfigMap's spec.yaml may grow by over dump_job: the fetched sources' paths in the pods.
LOCALIZED_SLACK_BYTES = 1 << 10


def size_problems(job: RLJob, lines: dict[tuple[str, ...], int] | None = None) -> list[SpecProblem]:
    """What the API server or etcd would refuse of the objects a valid `job` becomes, by size: the RLJob
    as stored, the ConfigMap holding its resolved spec (dump_job; dumped only where a cheap bound says it
    may not fit), a role's StatefulSet (its pod overrides twice: the role's container and the fetch step
    get env, envFrom and volumeMounts alike). Checked after validation, as apiVersion and kind are."""
    data = job.model_dump(mode="json", by_alias=True)
    size = json_bytes(data)
    if size > MAX_OBJECT_BYTES:
        return [SpecProblem("(document)", f"the RLJob is {size} bytes as JSON, more than the {MAX_OBJECT_BYTES} "
                                          "(1.5 MiB) etcd stores of one object")]
    limit = MAX_CONFIG_MAP_BYTES - LOCALIZED_SLACK_BYTES
    if yaml_bytes_bound(data) > limit:
        size = len(_dump(data).encode())
        if size > limit:
            return [SpecProblem("spec", f"the resolved spec the pods read is {size} bytes of YAML, more than the "
                                f"{limit} its ConfigMap may hold (Kubernetes' 1 MiB for a ConfigMap's data)",
                                (lines or {}).get(("spec",)))]
    for role in ROLES:
        size = 2 * json_bytes(data["spec"][role]["pod"]) + OPERATOR_POD_BYTES
        if size > MAX_OBJECT_BYTES:
            return [SpecProblem(f"spec.{role}.pod", f"the role's StatefulSet would be about {size} bytes, more than "
                                f"the {MAX_OBJECT_BYTES} (1.5 MiB) etcd stores of one object (the overrides go to "
                                "the role's container and its fetch step)", (lines or {}).get(("spec", role, "pod")))]
    return []
