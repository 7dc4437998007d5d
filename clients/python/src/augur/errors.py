"""Exceptions raised by the client.

Every error answer of the API (``{"error": {"code", "message", "field"}}``) becomes an
:class:`AugurError` subclass chosen by its HTTP status, carrying the API's ``code``,
``message`` and ``field`` (the offending input, e.g. ``parameters[2].min``) and the status.
A server that cannot be reached after the retries raises :class:`Unavailable` with
``status`` ``None``.
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = [
    "AugurError",
    "InvalidArgument",
    "Unauthenticated",
    "PermissionDenied",
    "NotFound",
    "MethodNotAllowed",
    "Conflict",
    "FailedPrecondition",
    "PayloadTooLarge",
    "UnsupportedMediaType",
    "ResourceExhausted",
    "Internal",
    "Unavailable",
    "error_for",
]


class AugurError(Exception):
    """An error answered by the Augur API, or the server could not be reached.

    Attributes:
        code: The API's error code (``invalid_argument``, ``not_found``, ...), or
            ``unavailable`` when no answer came.
        message: The API's human-readable message.
        field: The offending input named by the API (``parameters[2].min``), if any.
        status: The HTTP status, or ``None`` when no answer came.
        method: The HTTP method of the failed request.
        path: The path of the failed request (``/v1/studies/3``).
        ambiguous: True when an earlier attempt of this call got no clear answer, so the
            server may have applied it before this error (see the README's retry table).
    """

    def __init__(
        self,
        message: str,
        *,
        code: str = "unknown",
        field: Optional[str] = None,
        status: Optional[int] = None,
        method: Optional[str] = None,
        path: Optional[str] = None,
    ) -> None:
        self.code = code
        self.message = message
        self.field = field
        self.status = status
        self.method = method
        self.path = path
        self.ambiguous = False
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"{self.method} {self.path}: " if self.method else ""
        status = f"{self.status} " if self.status is not None else ""
        field = f" (field {self.field})" if self.field else ""
        return f"{where}{status}{self.code}: {self.message}{field}"

    def __reduce__(self) -> Any:  # keeps the attributes across pickling (multiprocessing)
        return (
            _rebuild,
            (type(self), self.message, self.code, self.field, self.status, self.method, self.path),
        )


def _rebuild(cls: type[AugurError], message: str, code: str, field: Optional[str], status: Optional[int],
             method: Optional[str], path: Optional[str]) -> AugurError:
    error: AugurError = cls(message, code=code, field=field, status=status, method=method, path=path)
    return error


class InvalidArgument(AugurError):
    """400: a field of the request is wrong; ``field`` names it."""


class Unauthenticated(AugurError):
    """401: no valid bearer token."""


class PermissionDenied(AugurError):
    """403: the token may not do this (a reader's token writing, a trial token elsewhere)."""


class NotFound(AugurError):
    """404: no such study, trial or route."""


class MethodNotAllowed(AugurError):
    """405: the route exists but not with this method."""


class Conflict(AugurError):
    """409 (``failed_precondition``): the study or trial is in the wrong state.

    For example completing a trial that already finished, or adding a trial to a study
    whose budget is spent.
    """


#: The API's name for :class:`Conflict`.
FailedPrecondition = Conflict


class PayloadTooLarge(AugurError):
    """413: the body is larger than the server accepts."""


class UnsupportedMediaType(AugurError):
    """415: the body was not sent as JSON."""


class ResourceExhausted(AugurError):
    """429: too many requests, still refused after the retries."""


class Internal(AugurError):
    """500: the server failed; the cause is in its log, never in the answer."""


class Unavailable(AugurError):
    """503/502/504, or no answer at all (connection refused, reset, timed out), after the
    retries the call was allowed."""


_BY_STATUS: dict[int, type[AugurError]] = {
    400: InvalidArgument,
    401: Unauthenticated,
    403: PermissionDenied,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    429: ResourceExhausted,
    500: Internal,
    502: Unavailable,
    503: Unavailable,
    504: Unavailable,
}


def error_for(status: int, body: Any, *, method: Optional[str] = None,
              path: Optional[str] = None) -> AugurError:
    """The exception for an error answer: its class from the status, its details from the
    API's error body (or the raw text of a body that is not the API's, e.g. a proxy's page)."""
    code, message, field = "unknown", f"HTTP {status}", None
    detail = body.get("error") if isinstance(body, dict) else None
    if isinstance(detail, dict):
        code = str(detail.get("code") or code)
        message = str(detail.get("message") or message)
        field = detail.get("field")
    elif isinstance(body, str) and body.strip():
        message = body.strip()[:500]
    cls = _BY_STATUS.get(status)
    if cls is None:
        cls = Internal if status >= 500 else AugurError
    return cls(message, code=code, field=field, status=status, method=method, path=path)
