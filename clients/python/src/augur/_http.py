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
import json as jsonlib
import logging
import random
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Mapping, Optional

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
    ) -> None:
        self.url = url.rstrip("/")
        self.retry = retry
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
    ) -> Any:
        """Send one API call and return its decoded JSON (``None`` for an empty answer).

        Raises the :mod:`augur.errors` exception for an error answer, after the retries the
        call's ``safety`` allows.
        """
        headers = dict(self._headers)
        content: Optional[bytes] = None
        if json is not _NO_BODY:
            content = jsonlib.dumps(json).encode()
            headers["content-type"] = "application/json"
        query = {k: v for k, v in (params or {}).items() if v is not None}
        url = self.url + path
        started = time.monotonic()
        retries = 0
        ambiguous = False
        while True:
            error: AugurError
            try:
                response = self.http.request(
                    method, url, content=content, params=query or None, headers=headers
                )
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as e:
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
                if response.status_code < 400:
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


def _body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


def _describe(e: httpx.TransportError) -> str:
    text = str(e) or type(e).__name__
    return f"{type(e).__name__}: {text}"
