"""Why a fetch failed, in a few words (workers/runtime/fetch.py puts them on one line after the source).

obstore's errors are a sentence followed by pages of Rust debug output, huggingface_hub's a paragraph
of advice; an init container's log, and `kubectl describe`, show one line best. The cause is the
store's own error code and message where it sent one (NoSuchBucket, InvalidAccessKeyId), else the
operating system's (connection refused), else which timeout ran out, with the endpoint and the
number of retries made.
"""

from __future__ import annotations

import re
from typing import Any

from rhymerl.workers.runtime.fetch_deadline import Limits

_STORE_CODE = re.compile(r"<Code>([^<]*)</Code>(?:\s*<Message>([^<]*)</Message>)?")
_OS_MESSAGE = re.compile(r'message: "([^"]*)"')
_RETRIES = re.compile(r"after (\d+) retries")
_ENDPOINT = re.compile(r"\b(https?://[^/\s?]+)")


def _timeouts(limits: Limits) -> str:
    return f"timed out (connect timeout {limits.connect_s:g} s, read timeout {limits.read_s:g} s)"


def s3_cause(exc: BaseException, limits: Limits) -> str:
    """The cause of an obstore error, with the endpoint it concerns and the retries made."""
    text = str(exc)
    head, _, debug = text.partition("\n\nDebug source:")
    code = _STORE_CODE.search(text)
    os_message = _OS_MESSAGE.findall(debug)
    if code:
        cause = f"{code[1]}: {code[2]}" if code[2] else code[1]
    elif os_message:
        cause = os_message[-1]
    elif re.search(r"kind: Timeout|TimedOut|timed out", debug or head):
        cause = _timeouts(limits)
    else:
        cause = head.strip().splitlines()[0].rsplit(" - ", 1)[-1] if head.strip() else type(exc).__name__
    where = [found[1]] if (found := _ENDPOINT.search(head)) else []
    retries = _RETRIES.search(head)
    if retries and retries[1] != "0":
        where.append(f"after {retries[1]} retries")
    return f"{cause} ({', '.join(where)})" if where else cause


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc` and the errors it came from, outermost first."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not e for e in seen):
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def hub_cause(exc: BaseException, limits: Limits) -> str:
    """The cause of a huggingface_hub error: its HTTP status and what it means, or the network
    error under its advice (a timeout, a refused connection), with the hub's endpoint."""
    import httpx2
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    chain = _chain(exc)
    http: Any = next((e for e in chain if isinstance(e, HfHubHTTPError)), None)
    network = next((e for e in reversed(chain) if isinstance(e, httpx2.TransportError)), None)
    if http is not None:
        meaning = (
            "a gated repository that HF_TOKEN does not open" if isinstance(http, GatedRepoError) else
            "no such repository, or a private one that HF_TOKEN does not open"
            if isinstance(http, RepositoryNotFoundError) else
            "no such revision" if isinstance(http, RevisionNotFoundError) else
            "no such file in the repository" if isinstance(http, RemoteEntryNotFoundError) else
            http.server_message or _first_line(http))
        cause = f"HTTP {http.response.status_code}: {meaning}"
    elif isinstance(network, httpx2.TimeoutException):
        cause = _timeouts(limits)
    elif network is not None:
        cause = _first_line(network) or type(network).__name__
    else:
        cause = _first_line(exc) or type(exc).__name__
    return f"{cause} ({constants.ENDPOINT})"


def _first_line(exc: BaseException) -> str:
    return next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
