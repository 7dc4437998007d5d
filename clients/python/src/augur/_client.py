"""The client's objects: :class:`Client`, :class:`Study`, :class:`Trial`.

They are thin views over the REST API (``openapi.yaml``); each method is one call, except the
waiting loops (:meth:`Study.next_trial`, :meth:`Study.work`) and the reconciliation of a
``complete``/``fail``/``delete`` whose first answer was lost (see ``_http.py``).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import secrets
import socket
import threading
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Mapping, Optional, Sequence, Union

import httpx

from ._http import RetryPolicy, Safety, Transport
from .errors import AugurError, Conflict, MethodNotAllowed, NotFound, PermissionDenied

if TYPE_CHECKING:
    import pandas  # type: ignore[import-untyped,unused-ignore]

log = logging.getLogger("augur")

__all__ = ["Client", "Study", "Trial", "Suggestions", "SHOULD_STOP_METHODS", "dispatched_trial"]

#: The methods tried, in order, for ``…/trials/{trial}/should_stop``. The API acts on the
#: verdict with POST (a trial told to stop moves to ``stopping``); its GET only reads it.
#: Servers before issue 10 answered GET only (and let a trial token GET it only), so the
#: client falls back to GET on 405 or 403, remembering per :class:`Client` which one the
#: server took. Once no such server is left, this is ``("POST",)``.
SHOULD_STOP_METHODS = ("POST", "GET")

#: Trial states after which nothing more can be reported.
FINISHED_STATES = frozenset({"completed", "infeasible", "failed"})
# A multi-fidelity trial that completed below its full budget waits for the scheduler: its
# holder is done with it (a promotion hands it out again, at a larger budget).
RELEASED_STATES = FINISHED_STATES | {"paused"}

Spec = Union[Mapping[str, Any], str, "os.PathLike[str]"]


def _new_client_id(prefix: str = "py") -> str:
    return f"{prefix}-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


class Client:
    """A connection to an Augur server.

    Args:
        url: The server, e.g. ``http://127.0.0.1:8080``; ``$AUGUR_URL`` or
            ``http://127.0.0.1:8080`` when not given.
        token: A bearer token; ``$AUGUR_TOKEN`` when not given, none if that is unset (a
            server on loopback without a token configured is open).
        timeout: Seconds to wait for each answer (the server gives up on a request at 60 s).
        retry: How failed calls are retried (:class:`augur.RetryPolicy`).
        http_client: An ``httpx.Client`` to send requests with, instead of a new one (it must
            not set a ``base_url``; the client is not closed by :meth:`close`).
        follow_owners: Send a busy study's changes to the replica that owns it, once a
            replica that forwarded one names it (``augur-study-replica``), saving the hop;
            reads stay on ``url``. An owner that cannot be reached is dropped for good and
            ``url`` used again. Off: every call goes to ``url``.

    The client is thread-safe: one instance may be shared by the threads of a process.
    Use it as a context manager, or call :meth:`close`, to release its connections.
    """

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        *,
        timeout: float = 75.0,
        retry: Optional[RetryPolicy] = None,
        http_client: Optional[httpx.Client] = None,
        follow_owners: bool = True,
    ) -> None:
        url = url or os.environ.get("AUGUR_URL") or "http://127.0.0.1:8080"
        if token is None:
            token = os.environ.get("AUGUR_TOKEN") or None
        self.url = url.rstrip("/")
        self._http = Transport(
            self.url, token, timeout=timeout, retry=retry or RetryPolicy(),
            http_client=http_client, follow_owners=follow_owners,
        )
        self._should_stop_methods: tuple[str, ...] = SHOULD_STOP_METHODS

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the client's connections."""
        self._http.close()

    def _with_retry(self, retry: RetryPolicy) -> "Client":
        """The same client (its connections, token and replicas) with another retry policy:
        e.g. none, for a last call at interpreter exit that must not wait for a server that
        is gone."""
        other = copy.copy(self)
        other._http = copy.copy(self._http)
        other._http.retry = retry
        return other

    def __repr__(self) -> str:
        return f"augur.Client({self.url!r})"

    # -- studies ---------------------------------------------------------------------------

    def create_study(self, spec: Spec) -> "Study":
        """Create a study from a spec: a mapping (the JSON of ``POST /v1/studies``) or the
        path of a ``.yaml``/``.yml`` (needs PyYAML: ``pip install 'augur-client[yaml]'``) or
        ``.json`` file, as ``augur study create -f`` reads it.

        Creating is not idempotent, so it is retried only when the server surely did not act
        (connection refused, 429, 503); when an answer is lost after the request was sent it
        raises :class:`augur.Unavailable` with ``ambiguous=True``. For a create that is safe to
        repeat, use :meth:`get_or_create_study`.
        """
        body = load_spec(spec)
        data = self._http.request("POST", "/v1/studies", json=body, safety=Safety.UNSAFE)
        return Study(self, data)

    def get_or_create_study(self, spec: Spec) -> "Study":
        """The study named ``spec["name"]``, created from ``spec`` if there is none.

        Safe to call from many processes at once: when two create the study together, both
        end up with the older one (the younger is deleted while it is still empty). A study
        found by name is returned as it is: compare its :attr:`Study.spec` with yours if it
        matters. (The API has no create-if-absent, so two creators whose commits land more
        than ``settle`` apart may, very rarely, each keep their own; see the README.)
        """
        body = load_spec(spec)
        name = body.get("name")
        if not isinstance(name, str):
            raise ValueError("the spec needs a name to be found by")
        existing = self._oldest_named(name)
        if existing is not None:
            return existing
        created = self.create_study(body)
        # Let a concurrent creator's commit land, then keep the oldest study of this name.
        time.sleep(0.5)
        oldest = self._oldest_named(name)
        if oldest is not None and oldest.id < created.id:
            log.info("study %d %r already existed; deleting the duplicate %d", oldest.id, name,
                     created.id)
            try:
                created.delete()
            except AugurError as e:  # harmless: an empty duplicate stays behind
                log.warning("could not delete duplicate study %d: %s", created.id, e)
            return oldest
        return created

    def _oldest_named(self, name: str) -> Optional["Study"]:
        for study in self.studies(name=name):  # ascending ids
            if study.name == name:
                return study
        return None

    def study(self, study_id: int) -> "Study":
        """The study with this id (raises :class:`augur.NotFound` when there is none)."""
        data = self._http.request("GET", f"/v1/studies/{int(study_id)}", safety=Safety.IDEMPOTENT)
        return Study(self, data)

    def studies(
        self, *, state: Optional[str] = None, name: Optional[str] = None, page_size: int = 100
    ) -> Iterator["Study"]:
        """Every study by ascending id, fetched a page at a time.

        Args:
            state: Only studies in this state (``active``, ``completed``, ``stopped``,
                ``failed``).
            name: Only studies whose name contains this (case-insensitive).
            page_size: Studies per request (1-1000).
        """
        token: Optional[str] = None
        while True:
            page = self._http.request(
                "GET",
                "/v1/studies",
                params={"state": state, "name": name, "page_size": page_size, "page_token": token},
                safety=Safety.IDEMPOTENT,
            )
            for data in page.get("studies", []):
                yield Study(self, data)
            token = page.get("next_page_token")
            if not token:
                return

    # -- used by Study and Trial -----------------------------------------------------------

    def _should_stop(self, study_id: int, trial_id: int) -> bool:
        path = f"/v1/studies/{study_id}/trials/{trial_id}/should_stop"
        methods = self._should_stop_methods
        first: Optional[AugurError] = None
        for i, method in enumerate(methods):
            try:
                answer = self._http.request(method, path, safety=Safety.IDEMPOTENT)
            except (MethodNotAllowed, PermissionDenied) as e:
                # 405: the server does not take this method here. 403: today's servers let a
                # trial token GET should_stop but not POST it. Either way try the next method;
                # if the last is refused as a method too, the first refusal is the one that
                # explains.
                if i + 1 < len(methods):
                    first = first or e
                    continue
                if isinstance(e, MethodNotAllowed) and first is not None:
                    raise first from None
                raise
            if i:
                self._should_stop_methods = methods[i:]
            return bool(answer["should_stop"])
        raise AssertionError("unreachable")


def load_spec(spec: Spec) -> Dict[str, Any]:
    """A study spec as a dict: a mapping as it is, or a YAML or JSON file read the way
    ``augur study create -f`` reads it (relative ``trial_job.workdir`` and
    ``trial_job.output_dir`` resolved against the file's directory)."""
    if isinstance(spec, Mapping):
        return dict(spec)
    if not isinstance(spec, (str, os.PathLike)):
        raise TypeError(f"a study spec is a mapping or a file path, not {type(spec).__name__}")
    path = Path(spec)
    text = path.read_text()
    if path.suffix.lower() == ".json":
        body = json.loads(text)
    else:
        try:
            import yaml  # type: ignore[import-untyped,unused-ignore]
        except ImportError as e:
            raise ImportError(
                f"reading the YAML spec {path} needs PyYAML: pip install 'augur-client[yaml]' "
                "(or pass the spec as a dict)"
            ) from e
        body = yaml.safe_load(text)
    if not isinstance(body, dict):
        raise ValueError(f"{path}: a study spec is a mapping, not {type(body).__name__}")
    job = body.get("trial_job")
    if isinstance(job, dict):
        for key in ("workdir", "output_dir"):
            value = job.get(key)
            if isinstance(value, str) and not os.path.isabs(value):
                job[key] = str((path.parent / value).resolve())
    return body


def dispatched_trial(client: Optional[Client] = None) -> "Trial":
    """The trial this process runs, when Augur dispatched it (a ``trial_job``): from
    ``$AUGUR_URL``, ``$AUGUR_STUDY_ID``, ``$AUGUR_TRIAL_ID`` and ``$AUGUR_TRIAL_TOKEN`` (a
    token that may only read and report to this trial)::

        trial = augur.dispatched_trial()
        for epoch in range(epochs):
            trial.report(epoch, {"accuracy": train_one_epoch(**trial.parameters)})
            if trial.should_stop():
                break

    The trial is not held: the dispatcher watches the job, so no heartbeat is needed, and the
    job's exit (with a reported metric) completes it; calling :meth:`Trial.complete` is also
    fine.
    """
    try:
        study_id = int(os.environ["AUGUR_STUDY_ID"])
        trial_id = int(os.environ["AUGUR_TRIAL_ID"])
    except KeyError as e:
        raise RuntimeError(f"${e.args[0]} is not set: this process was not dispatched by Augur") from None
    if client is None:
        client = Client(os.environ.get("AUGUR_URL"), os.environ.get("AUGUR_TRIAL_TOKEN"))
    # The trial token may not read the study: a stub stands for it.
    study = Study(client, {"id": study_id})
    return study.trial(trial_id)


class Suggestions(List["Trial"]):
    """The trials a :meth:`Study.suggest` handed out: a list of held :class:`Trial` s, plus
    what the server said about the rest.

    Attributes:
        study_state: The study's state (``active``, ``completed``, ``stopped``, ``failed``).
        retry_after_secs: Set when no trial could be handed out now but one may come later
            (the cap is full, or the last trials are still running): ask again after this
            many seconds. ``None`` with no trials means the study has ended.
    """

    study_state: str
    retry_after_secs: Optional[int]

    @property
    def ended(self) -> bool:
        """No trial now and none to come: the study completed, stopped or failed."""
        return not self and self.retry_after_secs is None


class _Annotated:
    """The note, tags and user attributes of a study or trial, from its :attr:`data` as last
    received."""

    data: Dict[str, Any]

    @property
    def note(self) -> Optional[str]:
        return self.data.get("note")

    @property
    def tags(self) -> List[str]:
        return list(self.data.get("tags") or [])

    @property
    def user_attrs(self) -> Dict[str, Any]:
        """Named values recorded beside the metrics (a trial's: :meth:`Trial.set_user_attr`)."""
        return dict(self.data.get("user_attrs") or {})


class Study(_Annotated):
    """A study on the server. Get one from :meth:`Client.study` or
    :meth:`Client.create_study`; :attr:`data` is the server's JSON as last fetched."""

    def __init__(self, client: Client, data: Mapping[str, Any]) -> None:
        self.client = client
        self.data: Dict[str, Any] = dict(data)
        self.id: int = int(self.data["id"])

    def __repr__(self) -> str:
        return f"<augur.Study {self.id} {self.name!r} {self.state}>"

    @property
    def _http(self) -> Transport:
        return self.client._http

    @property
    def _path(self) -> str:
        return f"/v1/studies/{self.id}"

    @property
    def name(self) -> str:
        return str(self.data.get("name", ""))

    @property
    def state(self) -> str:
        """``active``, ``completed``, ``stopped`` or ``failed``, as last fetched."""
        return str(self.data.get("state", ""))

    @property
    def spec(self) -> Dict[str, Any]:
        """The spec with the server's defaults filled in."""
        return dict(self.data.get("spec") or {})

    @property
    def trial_counts(self) -> Dict[str, int]:
        """Trials by state and ``total``, as last fetched."""
        return dict(self.data.get("trial_counts") or {})

    @property
    def metrics(self) -> List[Dict[str, str]]:
        """The study's metrics: ``[{"id": ..., "goal": "maximize" | "minimize"}]``."""
        return list(self.spec.get("metrics") or [])

    def refresh(self) -> "Study":
        """Fetch the study again (state, counts, best trial); returns itself."""
        self.data = self._http.request("GET", self._path, safety=Safety.IDEMPOTENT)
        return self

    # -- ask/tell ----------------------------------------------------------------------------

    def suggest(self, count: int = 1, client_id: Optional[str] = None) -> Suggestions:
        """Ask for up to ``count`` trials to run, each held with a background heartbeat.

        Args:
            count: How many trials (1-1000). The server never leaves more than the study's
                ``parallel_trials`` unfinished, nor hands out more than ``max_trials`` in all.
            client_id: A stable id of the worker: a worker that asks again while it holds
                unfinished trials gets those same trials back, so a restarted worker resumes
                them. When absent a fresh id is made for this call, which keeps the call
                safe to retry (a retried suggest with the same id hands out nothing twice).

        Returns:
            The trials (possibly none: see :attr:`Suggestions.retry_after_secs` and
            :attr:`Suggestions.ended`).
        """
        client_id = client_id or _new_client_id()
        answer = self._http.request(
            "POST",
            f"{self._path}/suggest",
            json={"count": int(count), "client_id": client_id},
            safety=Safety.IDEMPOTENT,  # the client_id makes a retry hand out the same trials
        )
        lease = float(self.spec.get("trial_lease_secs") or 600)
        result = Suggestions(Trial(self, t, held=True, lease_secs=lease) for t in answer.get("trials", []))
        result.study_state = answer.get("study_state", "")
        result.retry_after_secs = answer.get("retry_after_secs")
        self.data["state"] = result.study_state or self.data.get("state")
        return result

    def next_trial(
        self, client_id: Optional[str] = None, *, wait: bool = True, timeout: Optional[float] = None
    ) -> Optional["Trial"]:
        """The next trial for this worker, waiting while the cap is full.

        Returns ``None`` once the study has ended (or, with ``wait=False``, when no trial is
        free now; with a ``timeout``, when none came in time). A worker holding unfinished
        trials (same ``client_id``) gets the first of them back.
        """
        client_id = client_id or _new_client_id()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            trials = self.suggest(1, client_id)
            if trials:
                for extra in trials[1:]:  # held from an earlier call: they come back next time
                    extra.release()
                return trials[0]
            if trials.ended or not wait:
                return None
            pause = float(trials.retry_after_secs or 1)
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                pause = min(pause, left)
            time.sleep(pause)

    def work(self, client_id: Optional[str] = None) -> Iterator["Trial"]:
        """Trials for this worker, one at a time, until the study ends::

            for trial in study.work("w1"):
                with trial:              # completes on exit, fails on an exception
                    trial.report(1, {"loss": train(**trial.parameters)})

        Each trial must be finished (completed or failed, e.g. by ``with trial:``) before the
        next is asked for; a trial left unfinished raises ``RuntimeError``, since asking again
        would only hand the same trial back.
        """
        client_id = client_id or _new_client_id()
        while True:
            trial = self.next_trial(client_id)
            if trial is None:
                return
            yield trial
            if not trial.finished:
                trial.release()
                raise RuntimeError(
                    f"trial {trial.id} was neither completed nor failed: finish it (complete(), "
                    "fail() or `with trial:`) before asking for the next"
                )

    def add_trial(
        self, parameters: Mapping[str, Any], metrics: Optional[Mapping[str, float]] = None
    ) -> "Trial":
        """Add a trial with chosen parameters: completed with ``metrics`` (a prior result the
        optimizer learns from), or, without them, ``requested`` (the next suggest hands it
        out first). Not idempotent: retried only when the server surely did not act."""
        body: Dict[str, Any] = {"parameters": dict(parameters)}
        if metrics is not None:
            body["final_measurement"] = {"metrics": dict(metrics)}
        data = self._http.request("POST", f"{self._path}/trials", json=body, safety=Safety.UNSAFE)
        return Trial(self, data)

    # -- reading -------------------------------------------------------------------------------

    def trial(self, trial_id: int) -> "Trial":
        """One trial with its measurements (not held: no heartbeat)."""
        data = self._http.request(
            "GET", f"{self._path}/trials/{int(trial_id)}", safety=Safety.IDEMPOTENT
        )
        return Trial(self, data)

    def trials(self, state: Optional[str] = None, *, page_size: int = 100) -> Iterator["Trial"]:
        """Every trial by ascending id (optionally only those in ``state``), fetched a page of
        ``page_size`` (1-1000) at a time as the generator is consumed."""
        token: Optional[str] = None
        while True:
            page = self._http.request(
                "GET",
                f"{self._path}/trials",
                params={"state": state, "page_size": page_size, "page_token": token},
                safety=Safety.IDEMPOTENT,
            )
            for data in page.get("trials", []):
                yield Trial(self, data)
            token = page.get("next_page_token")
            if not token:
                return

    def optimal_trials(self) -> List["Trial"]:
        """The best completed trial, or the Pareto set of a study with several metrics."""
        answer = self._http.request("GET", f"{self._path}/optimal_trials", safety=Safety.IDEMPOTENT)
        return [Trial(self, t) for t in answer.get("trials", [])]

    def best(self) -> Optional["Trial"]:
        """The best completed trial, or ``None`` before one completes. For a study with several
        metrics this is one trial of the Pareto set: use :meth:`optimal_trials`."""
        trials = self.optimal_trials()
        return trials[0] if trials else None

    def to_pandas(self, state: Optional[str] = None) -> "pandas.DataFrame":
        """Every trial as a ``pandas.DataFrame``, one row per trial: ``id``, ``state``,
        ``params_<id>`` for each parameter, ``metrics_<id>`` for each final metric value,
        ``user_attrs_<name>`` for each user attribute (as Optuna's ``trials_dataframe``),
        ``tags``, ``note``, ``early_stopped``, ``excluded``, ``client_id``,
        ``infeasible_reason``, ``fail_reason`` and the
        ``created_at``/``started_at``/``completed_at`` times. Needs pandas
        (``pip install 'augur-client[pandas]'``)."""
        try:
            import pandas  # type: ignore[import-untyped,unused-ignore]
        except ImportError as e:
            raise ImportError(
                "Study.to_pandas needs pandas: pip install 'augur-client[pandas]'"
            ) from e
        rows = []
        for t in self.trials(state):
            row: Dict[str, Any] = {"id": t.id, "state": t.state}
            for key, value in t.parameters.items():
                row[f"params_{key}"] = value
            for key, value in (t.metrics or {}).items():
                row[f"metrics_{key}"] = value
            for key, value in t.user_attrs.items():
                row[f"user_attrs_{key}"] = value
            row["tags"] = t.tags
            row["note"] = t.note
            for key in ("early_stopped", "excluded", "client_id", "infeasible_reason",
                        "fail_reason", "created_at", "started_at", "completed_at"):
                row[key] = t.data.get(key)
            rows.append(row)
        base = ["id", "state"]
        params = sorted({k for r in rows for k in r if k.startswith("params_")})
        metrics = sorted({k for r in rows for k in r if k.startswith("metrics_")})
        attrs = sorted({k for r in rows for k in r if k.startswith("user_attrs_")})
        rest = ["tags", "note", "early_stopped", "excluded", "client_id", "infeasible_reason", "fail_reason",
                "created_at", "started_at", "completed_at"]
        frame = pandas.DataFrame.from_records(rows, columns=base + params + metrics + attrs + rest)
        for key in ("created_at", "started_at", "completed_at"):
            frame[key] = pandas.to_datetime(frame[key], utc=True, format="ISO8601")
        return frame

    # -- changing the study --------------------------------------------------------------------

    def update(
        self,
        *,
        max_trials: Optional[int] = None,
        parallel_trials: Optional[int] = None,
        max_failed_trials: Optional[int] = None,
        note: Optional[str] = None,
        tags: Optional[Sequence[str]] = None,
        user_attrs: Optional[Mapping[str, Any]] = None,
    ) -> "Study":
        """Change the budget of a live study (raising it reopens a study that completed on
        its budget), or its note, tags (all of them; ``[]`` removes them) and user
        attributes (merged; a ``None`` value removes one), in any state. Returns itself,
        refreshed."""
        body = {
            k: v
            for k, v in (
                ("max_trials", max_trials),
                ("parallel_trials", parallel_trials),
                ("max_failed_trials", max_failed_trials),
                ("note", note),
                ("tags", list(tags) if tags is not None else None),
                ("user_attrs", dict(user_attrs) if user_attrs is not None else None),
            )
            if v is not None
        }
        self.data = self._http.request("PATCH", self._path, json=body, safety=Safety.IDEMPOTENT)
        return self

    def add_parameter(
        self,
        parameter: Mapping[str, Any],
        parent: Optional[Mapping[str, Any]] = None,
        *,
        trials: Optional[Mapping[int, Any]] = None,
    ) -> "Study":
        """Grow the study's search space by one parameter while it runs.

        Args:
            parameter: The parameter as in a study spec, e.g. ``{"id": "momentum", "type":
                "double", "min": 0, "max": 1}``.
            parent: ``None`` for a top-level parameter (in every trial from now on), or
                ``{"id": "optimizer", "values": ["sgd"]}`` for a child that is active when
                its parent takes one of ``values``. For a child the study has already, the
                values it lacks are added to those that activate it.
            trials: Values of the parameter for unfinished trials handed out before it was
                added, by trial id (``{7: 0.9}``): they run with them, and the optimizer
                learns from them.

        Adding what the study has already (same definition, same parent) changes nothing,
        so the call is safe to repeat. Raises :class:`augur.Conflict` when the study has the
        parameter with another definition or parent (``field`` names what differs), when a
        trial named has finished or has another value, or when the study was stopped or
        searches a grid; :class:`augur.InvalidArgument` for a bad field (``field`` names
        it). Returns itself, refreshed."""
        body: Dict[str, Any] = {"parameter": dict(parameter)}
        if parent is not None:
            body["parent"] = dict(parent)
        if trials:
            body["trials"] = [{"id": int(t), "value": v} for t, v in trials.items()]
        self.data = self._http.request(
            "POST", f"{self._path}/parameters", json=body, safety=Safety.IDEMPOTENT
        )
        return self

    def stop(self) -> "Study":
        """Stop the study: no more suggestions (running trials may still report). Returns
        itself, refreshed."""
        self.data = self._http.request("POST", f"{self._path}/stop", safety=Safety.IDEMPOTENT)
        return self

    def resume(self) -> "Study":
        """Run a failed study again (a PATCH no longer does): raises :class:`augur.Conflict`
        while its failures are at ``max_failed_trials`` or no trial is left (raise them with
        :meth:`update` first), and for a stopped study. Returns itself, refreshed."""
        self.data = self._http.request("POST", f"{self._path}/resume", safety=Safety.IDEMPOTENT)
        return self

    def delete(self) -> None:
        """Delete the study with all its trials and measurements."""
        try:
            self._http.request("DELETE", self._path, safety=Safety.IDEMPOTENT)
        except NotFound as e:
            if not e.ambiguous:
                raise
            # An earlier attempt deleted it and its answer was lost.


class _Heartbeat:
    """Renews a held trial's lease from a daemon thread until stopped.

    It holds no reference to its :class:`Trial`, so a trial that is dropped unfinished stops
    beating once it is garbage-collected, and its lease then runs out as the API intends.
    """

    def __init__(self, transport: Transport, path: str, interval: float) -> None:
        self._transport = transport
        self._path = path
        self.interval = interval
        self._stop = threading.Event()
        #: Set while the trial is being completed or failed: a refused beat then is expected.
        self.finishing = threading.Event()
        #: Set when the server said the trial is no longer running (finished, or its lease
        #: ran out and it went back to ``requested``).
        self.lost: Optional[AugurError] = None
        self.beats = 0
        self._thread = threading.Thread(
            target=self._run, name=f"augur-heartbeat{path}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._transport.request("POST", self._path, safety=Safety.IDEMPOTENT)
                self.beats += 1
            except (Conflict, NotFound) as e:
                if self._stop.is_set() or self.finishing.is_set():
                    return
                self.lost = e
                log.warning("heartbeat stopped: %s", e)
                return
            except AugurError as e:  # the next beat may get through
                log.warning("heartbeat failed: %s", e)
            except Exception:  # never let the thread die silently (e.g. interpreter shutdown)
                if self._stop.is_set():
                    return
                log.exception("heartbeat failed")


class Trial(_Annotated):
    """A trial of a study. One handed out by :meth:`Study.suggest` is *held*: a background
    thread renews its lease (every quarter of the study's ``trial_lease_secs``) until it is
    completed, failed or :meth:`release` d. Used as a context manager it completes on a clean
    exit (from its measurements, by the study's ``measurement_selection``, unless it was
    already finished) and fails on an exception, which is re-raised. On ``KeyboardInterrupt``
    or ``SystemExit`` it is left running, so that the same ``client_id`` resumes it (or its
    lease returns it to the study).

    :attr:`data` is the server's JSON as last received.
    """

    def __init__(
        self,
        study: Study,
        data: Mapping[str, Any],
        *,
        held: bool = False,
        lease_secs: float = 600.0,
    ) -> None:
        self.study = study
        self.data: Dict[str, Any] = dict(data)
        self.id: int = int(self.data["id"])
        self._heartbeat: Optional[_Heartbeat] = None
        self._finished_here = False
        if held and self.state not in FINISHED_STATES:
            interval = min(60.0, max(0.2, lease_secs / 4))
            self._heartbeat = _Heartbeat(study._http, f"{self._path}/heartbeat", interval)
            weakref.finalize(self, self._heartbeat.stop)

    def __repr__(self) -> str:
        return f"<augur.Trial {self.study.id}/{self.id} {self.state} {self.parameters}>"

    @property
    def _path(self) -> str:
        return f"/v1/studies/{self.study.id}/trials/{self.id}"

    @property
    def _http(self) -> Transport:
        return self.study._http

    @property
    def study_id(self) -> int:
        return self.study.id

    @property
    def parameters(self) -> Dict[str, Any]:
        """The values to run: ``{"C": 0.5, "kernel": "rbf"}`` (inactive conditional
        parameters absent)."""
        return dict(self.data.get("parameters") or {})

    @property
    def state(self) -> str:
        """``requested``, ``active``, ``stopping``, ``completed``, ``infeasible``,
        ``failed`` or (multi-fidelity) ``paused``, as last received."""
        return str(self.data.get("state", ""))

    @property
    def budget(self) -> Optional[float]:
        """Multi-fidelity studies: the budget to train this attempt to (the study's
        ``fidelity.argument``, e.g. epochs; an ``int`` for whole budgets). A trial that
        completes below the full budget pauses; a promotion hands the same trial out again
        with a larger one, to resume from its checkpoint. ``None`` in other studies."""
        return self.data.get("budget")

    @property
    def resume(self) -> bool:
        """Whether this suggestion hands the trial out again to go on from where it stopped
        (a promotion to a larger ``budget``): load its checkpoint and train only what is
        missing."""
        return bool(self.data.get("resume", False))

    @property
    def copying_from(self) -> Optional[int]:
        """PBT (``scheduler: pbt``): the trial whose checkpoint this segment starts from, or
        ``None`` to go on from this trial's own. Copy that trial's checkpoint over this
        one's, then call :meth:`checkpoint_copied` before training: the trial copied waits,
        paused, until then (or until this segment completes)."""
        lineage = self.data.get("lineage") or {}
        return lineage.get("copying_from")

    @property
    def lineage(self) -> List[Dict[str, Any]]:
        """PBT: the trial's segments, each ``{"from_budget", "parent", "parameters"}``
        (``parent`` absent where it went on from its own checkpoint)."""
        return list((self.data.get("lineage") or {}).get("segments") or [])

    @property
    def measurements(self) -> List[Dict[str, Any]]:
        return list(self.data.get("measurements") or [])

    @property
    def final_measurement(self) -> Optional[Dict[str, Any]]:
        return self.data.get("final_measurement")

    @property
    def metrics(self) -> Optional[Dict[str, float]]:
        """The final measurement's metrics, or ``None`` before the trial completes."""
        final = self.final_measurement
        return dict(final["metrics"]) if final else None

    @property
    def finished(self) -> bool:
        """Completed, infeasible or failed (as far as this object knows)."""
        return self._finished_here or self.state in FINISHED_STATES

    @property
    def held(self) -> bool:
        """Its heartbeat thread is running."""
        return self._heartbeat is not None and self._heartbeat.running

    @property
    def lease_lost(self) -> Optional[AugurError]:
        """Set when a heartbeat was refused: the trial finished elsewhere, or its lease had
        run out and it went back to the study for another worker."""
        return self._heartbeat.lost if self._heartbeat else None

    def set_user_attr(self, key: str, value: Any) -> "Trial":
        """Record a named value beside the metrics (any JSON value; ``None`` removes it), as
        Optuna's ``trial.set_user_attr``: shown in the dashboard's table, filterable there.
        The trial's own token may do it. Returns itself, updated."""
        return self.set_user_attrs({key: value})

    def set_user_attrs(self, attrs: Mapping[str, Any]) -> "Trial":
        """Record several user attributes at once (merged; ``None`` values remove)."""
        self.data = self._http.request(
            "PATCH", self._path, json={"user_attrs": dict(attrs)}, safety=Safety.IDEMPOTENT
        )
        return self

    def annotate(self, *, note: Optional[str] = None, tags: Optional[Sequence[str]] = None) -> "Trial":
        """Set the trial's note (``""`` removes it) and tags (all of them; ``[]`` removes
        them): the study's creator or an admin. Returns itself, updated."""
        body: Dict[str, Any] = {}
        if note is not None:
            body["note"] = note
        if tags is not None:
            body["tags"] = list(tags)
        self.data = self._http.request("PATCH", self._path, json=body, safety=Safety.IDEMPOTENT)
        return self

    def artifacts(self, root: str = "model") -> List[Dict[str, Any]]:
        """The files a dispatched trial's job left in its ``model`` (or ``checkpoints``)
        directory: ``[{"path", "size", "modified"}]``, in path order."""
        listing = self._http.request(
            "GET", f"{self._path}/artifacts", params={"root": root}, safety=Safety.IDEMPOTENT
        )
        return list(listing["files"])

    def read_artifact(self, path: str, root: str = "model") -> bytes:
        """One artifact's bytes (``path`` as :meth:`artifacts` names it)."""
        return self._http.request(
            "GET", f"{self._path}/artifacts/content", params={"path": path, "root": root},
            safety=Safety.IDEMPOTENT, raw=True,
        )

    def refresh(self) -> "Trial":
        """Fetch the trial again; returns itself."""
        self.data = self._http.request("GET", self._path, safety=Safety.IDEMPOTENT)
        return self

    def report(
        self, step: int, metrics: Mapping[str, float], *, elapsed_secs: Optional[float] = None
    ) -> "Trial":
        """Record an intermediate measurement (some or all of the study's metrics) at a
        training step (>= 0); a second report at the same step replaces the first. Renews
        the lease. Returns itself, updated."""
        body: Dict[str, Any] = {"step": int(step), "metrics": {k: float(v) for k, v in metrics.items()}}
        if elapsed_secs is not None:
            body["elapsed_secs"] = float(elapsed_secs)
        self.data = self._http.request(
            "POST", f"{self._path}/measurements", json=body, safety=Safety.IDEMPOTENT
        )
        return self

    def should_stop(self) -> bool:
        """Whether the study's early-stopping rule says this trial should stop now. When it
        does, the trial moves to ``stopping``: finish it with :meth:`complete` (it completes
        as early-stopped)."""
        return self.study.client._should_stop(self.study.id, self.id)

    def checkpoint_copied(self) -> "Trial":
        """PBT: say that :attr:`copying_from`'s checkpoint is now this trial's, so that the
        trial copied may train on. Returns itself, updated (still :attr:`resume`: the
        server says that only when it hands the trial out)."""
        resume = self.resume
        self.data = self._http.request(
            "POST", f"{self._path}/checkpoint_copied", safety=Safety.IDEMPOTENT
        )
        if resume:
            self.data["resume"] = True
        return self

    def heartbeat(self) -> "Trial":
        """Renew the lease now (the background thread does this for a held trial)."""
        self.data = self._http.request("POST", f"{self._path}/heartbeat", safety=Safety.IDEMPOTENT)
        return self

    def complete(
        self,
        metrics: Optional[Mapping[str, float]] = None,
        *,
        infeasible_reason: Optional[str] = None,
        step: Optional[int] = None,
    ) -> "Trial":
        """Finish the trial: with the final ``metrics`` (every metric of the study), as
        infeasible with a reason, or with neither, from its reported measurements by the
        study's ``measurement_selection``. Stops the heartbeat; returns itself, updated."""
        body: Dict[str, Any] = {}
        if metrics is not None:
            body["metrics"] = {k: float(v) for k, v in metrics.items()}
        if step is not None:
            body["step"] = int(step)
        if infeasible_reason is not None:
            body["infeasible_reason"] = infeasible_reason
        return self._finish("complete", body)

    def fail(self, reason: Optional[str] = None) -> "Trial":
        """Mark the trial failed, with a reason shown in the API and dashboard. Stops the
        heartbeat; returns itself, updated."""
        return self._finish("fail", {"reason": reason} if reason is not None else {})

    def _finish(self, verb: str, body: Dict[str, Any]) -> "Trial":
        if self._heartbeat is not None:
            self._heartbeat.finishing.set()
        try:
            self.data = self._http.request(
                "POST", f"{self._path}/{verb}", json=body, safety=Safety.IDEMPOTENT
            )
        except Conflict as e:
            # A retry after a lost answer finds the trial already finished: by that same
            # call when its state is the one asked for.
            if not e.ambiguous:
                raise
            current = self._http.request("GET", self._path, safety=Safety.IDEMPOTENT)
            wanted = {"fail": {"failed"}}.get(verb, {"completed", "infeasible", "paused"})
            if current.get("state") not in wanted:
                raise
            self.data = current
        finally:
            if self._heartbeat is not None and self.data.get("state") not in RELEASED_STATES:
                self._heartbeat.finishing.clear()
        self._finished_here = True
        self.release()
        return self

    def release(self) -> None:
        """Stop renewing the lease without finishing the trial: if nobody reports for it, it
        returns to the study after ``trial_lease_secs`` for another worker."""
        if self._heartbeat is not None:
            self._heartbeat.stop()

    def __enter__(self) -> "Trial":
        return self

    def __exit__(self, exc_type: Optional[type], exc: Optional[BaseException], tb: Any) -> None:
        if self.finished:
            self.release()
            return
        if exc_type is None:
            self.complete()
        elif issubclass(exc_type, Exception):
            try:
                self.fail(f"{exc_type.__name__}: {exc}"[:2000])
            except AugurError as e:  # never hide the exception that failed the trial
                log.warning("could not fail trial %d: %s", self.id, e)
                self.release()
        else:
            self.release()
