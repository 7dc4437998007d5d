"""The HTTP layer: one ``httpx.Client``, the API's errors as exceptions, and retries.

Which calls are retried, and when, is the one subtle thing here. A call is either
*idempotent* (sending it twice has the effect of sending it once: reads, heartbeats,
measurements, which replace the one at their step, stop, delete, complete and fail with the
reconciliation in ``_client.py``, suggest with a ``client_id``) or *unsafe* (creating a study,
adding a trial). Failures split the same way:

- the server surely did not act: the connection was refused or never opened, or it answered
  429 or 503 (both mean "not now, nothing done", and usually say when to come back with
  ``Retry-After``). Every call is retried.
- the outcome is unknown: the connection broke or timed out after the request was sent, or
  a gateway answered 502/504, or the server answered 500 (an internal error, such as its
  database being restarted, may or may not have happened before the commit). Only
  idempotent calls are retried; an unsafe one raises at once with ``ambiguous=True``.
"""

from __future__ import annotations

import email.utils
import enum
import ipaddress
import json as jsonlib
import logging
import random
import re
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Dict, Mapping, Optional, Set
from urllib.parse import urlsplit

import httpx

from .errors import AugurError, Unavailable, error_for

log = logging.getLogger("augur")

__version__ = "0.1.0"


class Safety(enum.Enum):
    """Whether a call may be sent again when its outcome is unknown."""

    IDEMPOTENT = "idempotent"
    UNSAFE = "unsafe"


#: Answers that mean the server did nothing and asks to be called again.
RETRY_ALWAYS = frozenset({429, 503})
#: Answers after which the call may or may not have been applied.
RETRY_IF_IDEMPOTENT = frozenset({500, 502, 504})


@dataclass(frozen=True)
class RetryPolicy:
    """How failed calls are retried.

    Attributes:
        max_retries: Retries after the first attempt (0 disables retrying).
        initial_backoff: Wait before the first retry, in seconds, doubled after each one.
        max_backoff: Longest wait of the client's own backoff (a server's ``Retry-After`` is
            honoured as given).
        deadline: No retry is made that would start later than this many seconds after the
            first attempt; the last error is raised instead.
    """

    max_retries: int = 8
    initial_backoff: float = 0.25
    max_backoff: float = 10.0
    deadline: float = 120.0

    def backoff(self, retry: int) -> float:
        """Exponential backoff with jitter: half fixed, half random, so that many workers
        that failed together do not come back together."""
        ceiling = min(self.max_backoff, self.initial_backoff * (2.0**retry))
        return ceiling / 2 + random.uniform(0, ceiling / 2)


def retry_after_seconds(value: Optional[str]) -> Optional[float]:
    """A ``Retry-After`` header as seconds from now: delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


_NO_BODY = object()

#: The answer header in which a replica names the replica that owns a study (its base URL),
#: answering a change of a study it does not own.
STUDY_REPLICA_HEADER = "augur-study-replica"
_STUDY_PATH = re.compile(r"/v1/studies/([0-9]+)(?:[/?]|$)")
#: How long to wait for a named owner to accept a connection before using the client's URL.
OWNER_CONNECT_TIMEOUT = 5.0


def changed_study(method: str, path: str) -> Optional[int]:
    """The study a request changes: any method but GET, HEAD and OPTIONS on
    ``/v1/studies/{id}`` or below it (what the server's replicas route to a study's owner)."""
    if method.upper() in ("GET", "HEAD", "OPTIONS"):
        return None
    match = _STUDY_PATH.match(path)
    if match is None or int(match.group(1)) <= 0:
        return None
    return int(match.group(1))


def follows(base: str, owner: str) -> bool:
    """Whether a client of ``base`` sends a study's changes to the ``owner`` a replica named:
    an http(s) URL with a host and no credentials, query or fragment, and https if ``base``
    is (a token sent over TLS is never sent in the clear to a URL a server named). A loopback
    owner only from a loopback ``base``: replicas on one host may name ``http://127.0.0.1:…``,
    which from another machine is that machine's own port, perhaps another server with a
    study of the same id."""
    try:
        b, o = urlsplit(base), urlsplit(owner)
        o.port  # raises ValueError for a port that is not a number
    except ValueError:
        return False
    if o.scheme not in ("http", "https") or (b.scheme == "https" and o.scheme != "https"):
        return False
    if _is_loopback(o.hostname) and not _is_loopback(b.hostname):
        return False
    extras = (o.username, o.password, o.query, o.fragment)
    return bool(o.hostname) and not any(extras)


def _is_loopback(host: Optional[str]) -> bool:
    """Whether a URL's host is this machine: ``localhost`` or a loopback address."""
    if not host:
        return False
    host = host.rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Transport:
    """Sends the API's requests with auth, turns error answers into exceptions, retries."""

    def __init__(
        self,
        url: str,
        token: Optional[str],
        *,
        timeout: float,
        retry: RetryPolicy,
        http_client: Optional[httpx.Client] = None,
        follow_owners: bool = True,
    ) -> None:
        self.url = url.rstrip("/")
        self.retry = retry
        self.follow_owners = follow_owners
        # Studies whose owner a replica named (their changes go there; reads stay on url),
        # and owners that refused a connection (never followed again by this client).
        self._owners: Dict[int, str] = {}
        self._unreachable: Set[str] = set()
        self._owners_lock = threading.Lock()
        headers = {"user-agent": f"augur-client/{__version__}", "accept": "application/json"}
        if token:
            headers["authorization"] = f"Bearer {token}"
        if http_client is None:
            http_client = httpx.Client(base_url=self.url, timeout=timeout)
            self._owns_client = True
        else:
            self._owns_client = False
        self._headers = headers
        self.http = http_client

    def close(self) -> None:
        if self._owns_client:
            self.http.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = _NO_BODY,
        params: Optional[Mapping[str, Any]] = None,
        safety: Safety,
        raw: bool = False,
    ) -> Any:
        """Send one API call and return its decoded JSON (``None`` for an empty answer), or
        with ``raw`` the answer's bytes.

        Raises the :mod:`augur.errors` exception for an error answer, after the retries the
        call's ``safety`` allows.
        """
        headers = dict(self._headers)
        content: Optional[bytes] = None
        if json is not _NO_BODY:
            content = jsonlib.dumps(json).encode()
            headers["content-type"] = "application/json"
        query = {k: v for k, v in (params or {}).items() if v is not None}
        study = changed_study(method, path) if self.follow_owners else None
        started = time.monotonic()
        retries = 0
        ambiguous = False
        while True:
            error: AugurError
            owner = self._owner_of(study)
            try:
                response = self.http.request(
                    method, (owner or self.url) + path, content=content, params=query or None,
                    headers=headers, timeout=self._timeout(owner),
                )
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as e:
                if owner is not None and not isinstance(e, httpx.PoolTimeout):
                    # The named owner is unreachable from here (or gone) and nothing was
                    # sent: send it where the client points at once, not as a retry.
                    log.info("replica %s unreachable (%s); using %s", owner, _describe(e), self.url)
                    self._forget(study, owner)
                    continue
                # Nothing was sent: safe to try again whatever the call.
                error = Unavailable(_describe(e), code="unavailable", method=method, path=path)
                retryable = True
                wait = None
            except httpx.TransportError as e:
                # Sent, maybe applied: the answer was lost.
                error = Unavailable(
                    f"{_describe(e)}; the server may have applied the request",
                    code="unavailable", method=method, path=path,
                )
                retryable = safety is Safety.IDEMPOTENT
                if retryable:
                    ambiguous = True
                else:
                    error.ambiguous = True
                wait = None
            else:
                named = response.headers.get(STUDY_REPLICA_HEADER)
                if study is not None and named:
                    self._follow(study, named)
                if response.status_code < 400:
                    if raw:
                        return response.content
                    if not response.content:
                        return None
                    return response.json()
                error = error_for(response.status_code, _body(response), method=method, path=path)
                status = response.status_code
                if status in RETRY_ALWAYS:
                    retryable = True
                elif status in RETRY_IF_IDEMPOTENT:
                    retryable = safety is Safety.IDEMPOTENT
                    if retryable:
                        ambiguous = True
                    else:
                        error.ambiguous = True
                else:
                    retryable = False
                wait = retry_after_seconds(response.headers.get("retry-after"))
            if ambiguous:
                error.ambiguous = True
            if not retryable or retries >= self.retry.max_retries:
                raise error
            # The server's Retry-After is honoured as given; our own backoff is capped.
            delay = wait if wait is not None else self.retry.backoff(retries)
            if time.monotonic() + delay - started > self.retry.deadline:
                raise error
            retries += 1
            log.warning("%s; retry %d in %.2fs", error, retries, delay)
            time.sleep(delay)

    def _owner_of(self, study: Optional[int]) -> Optional[str]:
        if study is None:
            return None
        with self._owners_lock:
            return self._owners.get(study)

    def _follow(self, study: int, owner: str) -> None:
        owner = owner.strip().rstrip("/")
        if not follows(self.url, owner):
            return
        with self._owners_lock:
            if owner not in self._unreachable:
                self._owners[study] = owner

    def _forget(self, study: Optional[int], owner: str) -> None:
        with self._owners_lock:
            self._unreachable.add(owner)
            if study is not None:
                self._owners.pop(study, None)

    def _timeout(self, owner: Optional[str]) -> Any:
        """The client's timeouts; for a named owner, a short connect timeout, since a replica
        address may not be reachable from here (e.g. a pod's behind a balancer)."""
        if owner is None:
            return httpx.USE_CLIENT_DEFAULT
        t = self.http.timeout
        connect = min(t.connect or OWNER_CONNECT_TIMEOUT, OWNER_CONNECT_TIMEOUT)
        return httpx.Timeout(connect=connect, read=t.read, write=t.write, pool=t.pool)


def _body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


def _describe(e: httpx.TransportError) -> str:
    text = str(e) or type(e).__name__
    return f"{type(e).__name__}: {text}"
