"""Augur's Python client.

    import augur

    client = augur.Client("http://127.0.0.1:8080")        # or $AUGUR_URL, $AUGUR_TOKEN
    study = client.create_study("study.yaml")              # or a dict, or client.study(1)
    for trial in study.work(client_id="w1"):               # waits while the cap is full
        with trial:                                        # fails on an exception, completes on exit
            trial.report(1, {"loss": train(**trial.parameters)})

The Optuna bridge is :class:`augur.optuna.AugurSampler` (``pip install 'augur-client[optuna]'``).
"""

from ._client import (
    SHOULD_STOP_METHODS,
    Client,
    Study,
    Suggestions,
    Trial,
    dispatched_trial,
    load_spec,
)
from ._http import RetryPolicy, __version__
from .errors import (
    AugurError,
    Conflict,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    UnsupportedMediaType,
)

__all__ = [
    "Client",
    "Study",
    "Trial",
    "Suggestions",
    "RetryPolicy",
    "load_spec",
    "dispatched_trial",
    "SHOULD_STOP_METHODS",
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
    "__version__",
]
