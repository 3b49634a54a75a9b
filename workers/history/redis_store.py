"""The Redis history store: what a job's rollouts leave for the next epoch, outside any process, so
rollout workers, history workers, a restarted controller and the operator's cleanup all see it.

Per (prompt, epoch) it keeps the responses (token arrays, zlib-compressed int32), their rewards and
lengths; per prompt, the serialised index of its latest epochs (`history_epochs` of them, the
earlier ones read back from their responses; exactly the bytes `HistoryIndex.to_bytes` ships to a
rollout worker). Keys (rhymerl.api.history_keys) all start with
the run's prefix `rhymerl:<namespace>:<job>:<run_id>:`:

    <prefix>responses:<prompt_id>:<epoch>   hash: tokens, offsets, rewards, lengths
    <prefix>index:<prompt_id>               hash: epoch, blob

A prompt's responses and its index are written in one MULTI/EXEC transaction, so a reader never
sees an index without the responses it was built from, and an epoch is indexed at most once (the
same check as the memory store: a second write of one epoch is a bug, not an update). The same
transaction deletes the responses no later index reads (those older than its `history_epochs - 1`
epochs before, keeping the newest epoch's), so a long run's Redis holds a bounded number of
epochs per prompt, as the memory store does.
"""

from __future__ import annotations

import contextlib
import itertools
import zlib
from collections.abc import Iterable

import numpy as np
import redis
from numpy.typing import NDArray

from rhymerl.algorithms.drafting.index import HistoryIndex
from rhymerl.api.credentials import masked
from rhymerl.api.history_keys import REDIS_PASSWORD_ENV, connect_problem, glob_escape
from rhymerl.errors import UserError
from rhymerl.workers.dumps import RolloutRecord
from rhymerl.workers.history.store import grouped

PING_TIMEOUT_S = 3.0


class HistoryStoreError(UserError):
    """Redis cannot be reached or refused the store; the message names the URL (never the password)."""


def _client(url: str, password: str | None, timeout_s: float) -> redis.Redis:
    """A client of `url`; a URL redis-py refuses is a HistoryStoreError (redis-py's ValueError may quote it)."""
    try:
        return redis.Redis.from_url(url, password=password, socket_timeout=timeout_s,
                                    socket_connect_timeout=timeout_s)
    except ValueError as exc:
        raise _problem(url, exc, password) from None


def _problem(url: str, exc: redis.RedisError | ValueError, password: str | None) -> HistoryStoreError:
    """One line a user can act on, naming the URL without its password."""
    if isinstance(exc, redis.AuthenticationError) or "NOAUTH" in str(exc) or "WRONGPASS" in str(exc):
        why = ("refused the password in " if password else "asks for a password: set ") + REDIS_PASSWORD_ENV
        return HistoryStoreError(f"history.redis_url {masked(url)}: Redis {why} (in a cluster pods get it from "
                                 "history.redis_password_secret)")
    return HistoryStoreError(f"history.redis_url {masked(url)}: {connect_problem(url, exc)}")


def ping(url: str, password: str | None = None, timeout_s: float = PING_TIMEOUT_S) -> None:
    """Reach the Redis at `url` (PING), so a run that would draft nothing says so before it starts."""
    client = _client(url, password, timeout_s)
    try:
        client.ping()
    except redis.RedisError as exc:
        raise _problem(url, exc, password) from None
    finally:
        client.close()


class RedisHistoryStore:
    def __init__(self, client: redis.Redis, prefix: str, reward_weighted: bool = False, epochs: int = 1) -> None:
        """epochs: how many of a prompt's latest epochs its index holds (`speculation.history_epochs`)."""
        if epochs < 1:
            raise ValueError(f"epochs {epochs}: must be >= 1")
        self.client = client
        self.prefix = prefix
        self.reward_weighted = reward_weighted
        self.epochs = epochs

    @classmethod
    def connect(cls, url: str, prefix: str, reward_weighted: bool = False, password: str | None = None,
                timeout_s: float = 10.0, epochs: int = 1) -> RedisHistoryStore:
        client = _client(url, password, timeout_s)
        try:
            client.ping()
        except redis.RedisError as exc:
            client.close()
            raise _problem(url, exc, password) from None
        return cls(client, prefix, reward_weighted, epochs)

    def close(self, clear: bool = False) -> None:
        """Close the connection; with `clear`, delete this store's keys first as far as Redis answers (a
        Redis that is down keeps them: the run's next start deletes them, and in a cluster the RLJob's
        finalizer)."""
        try:
            if clear:
                with contextlib.suppress(redis.RedisError):
                    self.clear()
        finally:
            self.client.close()

    def responses_key(self, prompt_id: str, epoch: int) -> str:
        return f"{self.prefix}responses:{prompt_id}:{epoch}"

    def index_key(self, prompt_id: str) -> str:
        return f"{self.prefix}index:{prompt_id}"

    def update(self, records: Iterable[RolloutRecord]) -> None:
        """Keep every prompt's responses of one epoch and index them with those of its `epochs - 1`
        epochs before (read back from Redis); a later epoch replaces the index."""
        groups = grouped(records)
        if not groups:
            return
        current = self._epochs(list(dict.fromkeys(pid for (pid, _), _ in groups)))
        for (pid, epoch), recs in groups:
            have = current.get(pid)
            if have is not None and have > epoch:
                continue
            if have is not None and have == epoch:
                raise ValueError(f"prompt {pid}: epoch {epoch} indexed twice")
            older = [r for e in range(epoch - self.epochs + 1, epoch) for r in zip(*self.responses(pid, e), strict=True)]
            index = HistoryIndex.build([*older, *((r.response_ids, r.reward) for r in recs)],
                                       reward_weighted=self.reward_weighted)
            stale = [self.responses_key(pid, e) for e in range(self._kept_from(have), self._kept_from(epoch))] \
                if have is not None else []
            with self.client.pipeline(transaction=True) as tx:
                tx.hset(self.responses_key(pid, epoch), items=_pack(recs))
                tx.hset(self.index_key(pid), mapping={"epoch": epoch, "blob": index.to_bytes()})
                if stale:
                    tx.unlink(*stale)
                tx.execute()
            current[pid] = epoch

    def _kept_from(self, epoch: int) -> int:
        """With `epoch` indexed, the oldest epoch whose responses are kept: the next index (of a later
        epoch) reads those from epoch + 2 - epochs on; the newest epoch's stay whatever `epochs`."""
        return min(epoch, epoch + 2 - self.epochs)

    def _epochs(self, prompt_ids: list[str]) -> dict[str, int]:
        with self.client.pipeline(transaction=False) as p:
            for pid in prompt_ids:
                p.hget(self.index_key(pid), "epoch")
            found = p.execute()
        return {pid: int(e) for pid, e in zip(prompt_ids, found, strict=True) if e is not None}

    def indexes_before(self, epoch: int, prompt_ids: Iterable[str]) -> dict[str, HistoryIndex]:
        """Indexes of the given prompts built from an epoch earlier than `epoch` (one round trip)."""
        ids = list(dict.fromkeys(prompt_ids))
        with self.client.pipeline(transaction=False) as p:
            for pid in ids:
                p.hmget(self.index_key(pid), ["epoch", "blob"])
            found = p.execute()
        out = {}
        for pid, (built, blob) in zip(ids, found, strict=True):
            if built is not None and blob is not None and int(built) < epoch:
                out[pid] = HistoryIndex.from_bytes(blob)
        return out

    def responses(self, prompt_id: str, epoch: int) -> tuple[list[list[int]], list[float]]:
        """The prompt's responses of `epoch` and their rewards, as stored (empty if none)."""
        raw: dict[bytes, bytes] = self.client.hgetall(self.responses_key(prompt_id, epoch))  # type: ignore[assignment]
        if not raw:
            return [], []
        offsets = np.frombuffer(raw[b"offsets"], dtype=np.int64)
        tokens = np.frombuffer(zlib.decompress(raw[b"tokens"]), dtype=np.int32)
        rewards = np.frombuffer(raw[b"rewards"], dtype=np.float64)
        return [tokens[a:b].tolist() for a, b in itertools.pairwise(offsets)], rewards.tolist()

    def lengths(self, prompt_id: str, epoch: int) -> NDArray[np.int64]:
        raw = self.client.hget(self.responses_key(prompt_id, epoch), "lengths")
        return np.frombuffer(raw, dtype=np.int64).copy() if isinstance(raw, bytes) else np.zeros(0, np.int64)

    def clear(self) -> int:
        """Delete every key under this store's prefix (one run's: a run starts from its dumps, and its
        keys go when it ends); returns how many."""
        deleted = 0
        batch: list[bytes] = []
        for name in self.client.scan_iter(match=glob_escape(self.prefix) + "*", count=500):
            batch.append(name)
            if len(batch) >= 500:
                deleted += int(self.client.unlink(*batch))
                batch = []
        if batch:
            deleted += int(self.client.unlink(*batch))
        return deleted

    def __len__(self) -> int:
        return sum(1 for _ in self.client.scan_iter(match=glob_escape(self.prefix) + "index:*", count=500))


def _pack(recs: list[RolloutRecord]) -> list[str | bytes]:
    """The responses hash as alternating field names and values."""
    lengths = np.array([len(r.response_ids) for r in recs], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = np.fromiter((t for r in recs for t in r.response_ids), dtype=np.int32, count=int(offsets[-1]))
    rewards = np.array([r.reward for r in recs], dtype=np.float64)
    return ["tokens", zlib.compress(tokens.tobytes(), 1), "offsets", offsets.tobytes(),
            "rewards", rewards.tobytes(), "lengths", lengths.tobytes()]
