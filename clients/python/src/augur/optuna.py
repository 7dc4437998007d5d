"""An Optuna sampler whose suggestions come from an Augur study: Optuna code runs unchanged
but for ``sampler=AugurSampler(client, ...)``.

How it works (Optuna's sampler protocol, all of it through *independent* sampling):

- The first trial in a process, when no Augur study of that name exists yet, *discovers*
  the search space: its values come from a fallback sampler (random by default) while the
  objective names its parameters. When it finishes, the Augur study is created from the
  distributions it asked for (float and int with ``log``, ``step`` as discrete values,
  categorical) and the trial is added to it as a completed trial. Other threads of the
  process wait for it meanwhile, so at most one trial per process is not Augur's.
- Every later trial is one Augur trial, suggested with a ``client_id`` of its own (so the
  call is safe to retry) and held with a heartbeat while the objective runs; each
  ``suggest_*`` call decodes that trial's value. When the objective returns, the trial is
  completed in Augur with the objective's value(s) (failed when the objective failed, and
  completed with its last intermediate value when it was pruned, intermediate values being
  sent as measurements).
- Several processes, on several machines, share one Augur study by naming it: the first to
  finish a trial creates it, the others find it by name. Augur's cap (``parallel_trials``)
  holds across all of them: a thread waits while it is full. When the study's budget
  (``max_trials``) is spent, the Optuna study is stopped and the trial that asked is pruned.

Not supported (each raises :class:`UnsupportedSearchSpace` or ``ValueError``): search spaces
that change after the first trial (a parameter not asked in it, or asked with another
distribution; conditional parameters whose branch was not taken in the first trial);
categorical choices whose string forms clash (``1`` and ``"1"``); an Augur study of the same
name with other parameters or objectives. Enqueued trials (``study.enqueue_trial``) are run
with their given values and added to Augur as completed trials.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import socket
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.samplers import BaseSampler, RandomSampler
from optuna.study import Study as OptunaStudy
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from . import _client
from .errors import AugurError, Conflict

__all__ = ["AugurSampler", "UnsupportedSearchSpace", "augur_parameter", "MAX_DISCRETE_VALUES"]

log = logging.getLogger("augur.optuna")

#: A stepped distribution with at most this many values becomes a ``discrete`` parameter;
#: a larger one a ``double``/``integer`` whose values are rounded to the step.
MAX_DISCRETE_VALUES = 1000

#: Optuna system attributes set on each trial: the Augur study and trial it ran as.
STUDY_ATTR = "augur:study_id"
TRIAL_ATTR = "augur:trial_id"


class UnsupportedSearchSpace(ValueError):
    """The objective asked for a parameter that the Augur study's search space, fixed by its
    first trial, cannot give."""


def augur_parameter(name: str, distribution: BaseDistribution) -> Dict[str, Any]:
    """The Augur parameter spec for an Optuna distribution."""
    if isinstance(distribution, FloatDistribution):
        low, high, step = distribution.low, distribution.high, distribution.step
        if step is not None:
            count = int(round((high - low) / step)) + 1
            if count <= MAX_DISCRETE_VALUES:
                return {"id": name, "type": "discrete", "values": _grid(low, step, count)}
        return {"id": name, "type": "double", "min": low, "max": high,
                "scale": "log" if distribution.log else "linear"}
    if isinstance(distribution, IntDistribution):
        low, high, step = distribution.low, distribution.high, distribution.step
        if step != 1:
            count = (high - low) // step + 1
            if count <= MAX_DISCRETE_VALUES:
                return {"id": name, "type": "discrete",
                        "values": [low + i * step for i in range(count)]}
        return {"id": name, "type": "integer", "min": low, "max": high,
                "scale": "log" if distribution.log else "linear"}
    if isinstance(distribution, CategoricalDistribution):
        return {"id": name, "type": "categorical", "values": list(_category_codes(name, distribution))}
    raise UnsupportedSearchSpace(
        f"parameter {name!r}: AugurSampler does not support {type(distribution).__name__}"
    )


def _grid(low: float, step: float, count: int) -> List[float]:
    # Rounded so that the values read back from JSON are the ones Optuna computes.
    return [float(round(low + i * step, 12)) for i in range(count)]


def _category_codes(name: str, distribution: CategoricalDistribution) -> Dict[str, Any]:
    """Augur categoricals are strings: each choice's string form, mapped back to it."""
    codes: Dict[str, Any] = {}
    for choice in distribution.choices:
        code = choice if isinstance(choice, str) else str(choice)
        if code == "" or code in codes:
            raise UnsupportedSearchSpace(
                f"parameter {name!r}: the choices {distribution.choices!r} do not have distinct, "
                "non-empty string forms, which Augur's categorical parameters need"
            )
        codes[code] = choice
    return codes


def _normal(param: Mapping[str, Any]) -> Dict[str, Any]:
    """The fields of a parameter spec that define it, with the server's defaults filled in."""
    kind = param.get("type")
    out: Dict[str, Any] = {"type": kind}
    if kind in ("double", "integer"):
        out.update(min=float(param["min"]), max=float(param["max"]),
                   scale=param.get("scale") or "linear")
    else:
        out["values"] = [float(v) if kind == "discrete" else v for v in param.get("values") or []]
    if param.get("children"):
        out["children"] = param["children"]
    return out


def _decode(value: Any, distribution: BaseDistribution, name: str) -> Any:
    """An Augur trial's value as the distribution's value."""
    if isinstance(distribution, CategoricalDistribution):
        codes = _category_codes(name, distribution)
        if value not in codes:
            raise UnsupportedSearchSpace(f"parameter {name!r}: {value!r} is not one of its choices")
        return codes[value]
    assert isinstance(distribution, (FloatDistribution, IntDistribution))
    number = float(value)
    low, high = distribution.low, distribution.high
    step = distribution.step
    if step is not None:
        number = low + round((number - low) / step) * step
    number = min(max(number, low), high)
    if isinstance(distribution, IntDistribution):
        return int(round(number))
    if step is not None:
        number = float(round(number, 12))
    return number


def _encode(value: Any, distribution: BaseDistribution, name: str) -> Any:
    """A value of an Optuna trial as Augur takes it."""
    if isinstance(distribution, CategoricalDistribution):
        for code, choice in _category_codes(name, distribution).items():
            if choice == value and type(choice) is type(value):
                return code
        return str(value)
    if isinstance(distribution, IntDistribution):
        return int(value)
    if isinstance(distribution, FloatDistribution) and distribution.step is not None:
        return float(round(value, 12))
    return float(value)


class _Stop(Exception):
    """The Augur study ended: no more trials."""


class AugurSampler(BaseSampler):
    """An Optuna sampler backed by an Augur study (by default its GP bandit).

    Args:
        client: The :class:`augur.Client` to reach the server with.
        study_name: The Augur study's name: processes that give the same name share one
            study (the first to finish a trial creates it). Defaults to the Optuna study's
            name (Optuna makes up a unique one when none is given, so name it to share).
        max_trials: The Augur study's budget in all processes together, when this sampler
            creates it. Once spent, each process's Optuna study is stopped.
        parallel_trials: The Augur study's cap on trials running at once in all processes
            together, when this sampler creates it; threads wait while it is full. Give at
            least the sum of ``n_jobs`` over the processes to never wait.
        algorithm: ``gp_bandit`` (default), ``random``, ``quasi_random`` or ``grid``.
        seed: The Augur study's seed (and the fallback sampler's).
        spec: Further fields of the Augur study spec, e.g. ``{"trial_lease_secs": 120}``.
        fallback_sampler: Samples the discovery trial and enqueued trials' missing values;
            ``RandomSampler(seed)`` by default.
        poll_secs: How often a waiting thread looks for the Augur study another process is
            creating.
    """

    def __init__(
        self,
        client: _client.Client,
        study_name: Optional[str] = None,
        *,
        max_trials: int = 1000,
        parallel_trials: int = 4,
        algorithm: str = "gp_bandit",
        seed: Optional[int] = None,
        spec: Optional[Mapping[str, Any]] = None,
        fallback_sampler: Optional[BaseSampler] = None,
        poll_secs: float = 0.5,
    ) -> None:
        self.client = client
        self.study_name = study_name
        self.max_trials = int(max_trials)
        self.parallel_trials = int(parallel_trials)
        self.algorithm = algorithm
        self.seed = seed
        self.extra_spec = dict(spec or {})
        self.poll_secs = poll_secs
        self._fallback = fallback_sampler or RandomSampler(seed=seed)
        self._client_prefix = f"optuna-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self._cond = threading.Condition()
        self._augur: Optional[_client.Study] = None
        self._params: Dict[str, Dict[str, Any]] = {}
        self._discovering: Optional[int] = None
        self._held: Dict[int, _client.Trial] = {}
        self._local: set[int] = set()
        self._ended = False
        self._last_find = -math.inf

    # -- what Optuna calls -------------------------------------------------------------------

    def infer_relative_search_space(
        self, study: OptunaStudy, trial: FrozenTrial
    ) -> Dict[str, BaseDistribution]:
        return {}

    def sample_relative(
        self, study: OptunaStudy, trial: FrozenTrial, search_space: Dict[str, BaseDistribution]
    ) -> Dict[str, Any]:
        return {}

    def sample_independent(
        self,
        study: OptunaStudy,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        tid = trial._trial_id
        with self._cond:
            held = self._held.get(tid)
            local = tid in self._local
        if held is None and not local:
            if trial.system_attrs.get("fixed_params"):
                held = None  # an enqueued trial: its values are the user's, added when done
            else:
                try:
                    held = self._acquire(study, trial)
                except _Stop:
                    try:
                        study.stop()
                    except RuntimeError:  # ask-and-tell, outside optimize()
                        pass
                    raise optuna.TrialPruned(
                        f"Augur study {self._augur.id if self._augur else '?'} has ended "
                        "(budget spent or stopped)"
                    ) from None
            if held is None:
                with self._cond:
                    self._local.add(tid)
        if held is not None:
            return self._value(held, param_name, param_distribution)
        if self._augur is not None and self._discovering != tid:
            self._check_param(param_name, param_distribution)
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(
        self,
        study: OptunaStudy,
        trial: FrozenTrial,
        state: TrialState,
        values: Optional[Sequence[float]],
    ) -> None:
        tid = trial._trial_id
        with self._cond:
            held = self._held.pop(tid, None)
            local = tid in self._local
            self._local.discard(tid)
            discovering = self._discovering == tid
        try:
            measured = values is not None and state in (TrialState.COMPLETE, TrialState.PRUNED)
            if held is not None:
                self._finish(study, trial, held, state, values)
            elif measured and (local or trial.system_attrs.get("fixed_params")) and any(
                not d.single() for d in trial.distributions.values()
            ):
                # Not Augur's suggestion (the discovery trial, an enqueued one): a prior result.
                if self._augur is None:
                    self._create(study, trial)
                self._add_completed(study, trial, values)
        finally:
            if discovering:
                with self._cond:
                    self._discovering = None
                    self._cond.notify_all()

    def reseed_rng(self) -> None:
        self._fallback.reseed_rng()

    # -- the Augur study ---------------------------------------------------------------------

    @property
    def augur_study(self) -> Optional[_client.Study]:
        """The Augur study this sampler runs on, once known."""
        return self._augur

    def _name(self, study: OptunaStudy) -> str:
        return self.study_name or study.study_name

    def _metrics(self, study: OptunaStudy) -> List[Dict[str, str]]:
        directions = study.directions
        names = study.metric_names
        if names is None:
            names = ["value"] if len(directions) == 1 else [f"value_{i}" for i in range(len(directions))]
        return [
            {"id": n, "goal": "maximize" if d == StudyDirection.MAXIMIZE else "minimize"}
            for n, d in zip(names, directions)
        ]

    def _acquire(self, study: OptunaStudy, trial: FrozenTrial) -> Optional[_client.Trial]:
        """The Augur trial for this Optuna trial, or ``None`` when it is to discover the
        search space. Waits while another thread discovers it, or while the cap is full."""
        with self._cond:
            while self._augur is None:
                if self._ended:
                    raise _Stop
                if time.monotonic() - self._last_find >= self.poll_secs:
                    self._last_find = time.monotonic()
                    if self._find(study) is not None:
                        break
                if self._discovering is None:
                    self._discovering = trial._trial_id
                    return None
                self._cond.wait(self.poll_secs)
        augur = self._augur
        assert augur is not None
        client_id = f"{self._client_prefix}-{trial._trial_id}"
        while True:
            suggestions = augur.suggest(1, client_id)
            if suggestions:
                held = suggestions[0]
                break
            if suggestions.ended:
                self._ended = True
                raise _Stop
            time.sleep(float(suggestions.retry_after_secs or 1))
        with self._cond:
            self._held[trial._trial_id] = held
        storage = study._storage
        storage.set_trial_system_attr(trial._trial_id, STUDY_ATTR, augur.id)
        storage.set_trial_system_attr(trial._trial_id, TRIAL_ATTR, held.id)
        return held

    def _find(self, study: OptunaStudy) -> Optional[_client.Study]:
        """Attach to the Augur study of this name if there is one (caller holds the lock)."""
        name = self._name(study)
        for candidate in self.client.studies(name=name):
            if candidate.name == name:
                self._attach(study, candidate)
                return candidate
        return None

    def _attach(self, study: OptunaStudy, augur: _client.Study) -> None:
        wanted = self._metrics(study)
        have = [{"id": m["id"], "goal": m["goal"]} for m in augur.metrics]
        if have != wanted:
            raise ValueError(
                f"Augur study {augur.id} {augur.name!r} has the metrics {have}, but this Optuna "
                f"study's objectives are {wanted}: use another study_name"
            )
        self._params = {p["id"]: p for p in augur.spec.get("parameters", [])}
        self._augur = augur
        if augur.state != "active":
            log.warning("Augur study %d %r is %s: no trials left to run", augur.id, augur.name,
                        augur.state)
            self._ended = True
        log.info("running on Augur study %d %r", augur.id, augur.name)

    def _create(self, study: OptunaStudy, trial: FrozenTrial) -> None:
        """Create (or find) the Augur study from the discovery trial's distributions."""
        parameters = [
            augur_parameter(name, dist)
            for name, dist in trial.distributions.items()
            if not dist.single()
        ]
        spec: Dict[str, Any] = {
            "name": self._name(study),
            "algorithm": self.algorithm,
            "metrics": self._metrics(study),
            "parameters": parameters,
            "max_trials": self.max_trials,
            "parallel_trials": self.parallel_trials,
        }
        if self.seed is not None:
            spec["seed"] = self.seed
        spec.update(self.extra_spec)
        augur = self.client.get_or_create_study(spec)
        with self._cond:
            self._attach(study, augur)
            self._cond.notify_all()
        for name, dist in trial.distributions.items():
            if not dist.single():
                self._check_param(name, dist)

    def _check_param(self, name: str, distribution: BaseDistribution) -> None:
        have = self._params.get(name)
        if have is None:
            raise UnsupportedSearchSpace(
                f"parameter {name!r} is not in Augur study {self._augur.id if self._augur else '?'}'s "
                f"search space {sorted(self._params)}: AugurSampler fixes the search space at "
                "the first trial, and does not support parameters that appear later (dynamic "
                "or conditional search spaces)"
            )
        wanted = augur_parameter(name, distribution)
        if _normal(have) != _normal(wanted):
            raise UnsupportedSearchSpace(
                f"parameter {name!r} is {distribution} here, but {_normal(have)} in Augur study "
                f"{self._augur.id if self._augur else '?'}: a parameter's distribution must not "
                "change after the first trial"
            )

    def _value(self, held: _client.Trial, name: str, distribution: BaseDistribution) -> Any:
        self._check_param(name, distribution)
        if name not in held.parameters:
            raise UnsupportedSearchSpace(
                f"Augur trial {held.id} has no value for {name!r} (a conditional parameter)"
            )
        return _decode(held.parameters[name], distribution, name)

    def _finish(
        self,
        study: OptunaStudy,
        trial: FrozenTrial,
        held: _client.Trial,
        state: TrialState,
        values: Optional[Sequence[float]],
    ) -> None:
        metrics = self._metrics(study)
        try:
            if values is not None and state in (TrialState.COMPLETE, TrialState.PRUNED):
                if len(metrics) == 1:
                    for step, value in sorted(trial.intermediate_values.items()):
                        if math.isfinite(value):
                            held.report(step, {metrics[0]["id"]: value})
                held.complete({m["id"]: v for m, v in zip(metrics, values)})
            else:
                held.fail(f"Optuna trial {trial.number} {state.name.lower()}")
        except AugurError as e:
            held.release()
            log.warning("could not finish Augur trial %d: %s", held.id, e)

    def _add_completed(
        self, study: OptunaStudy, trial: FrozenTrial, values: Optional[Sequence[float]]
    ) -> None:
        augur = self._augur
        if augur is None or values is None:
            return
        for name, dist in trial.distributions.items():
            if not dist.single():
                self._check_param(name, dist)
        params = {
            name: _encode(trial.params[name], dist, name)
            for name, dist in trial.distributions.items()
            if not dist.single()
        }
        metrics = {m["id"]: v for m, v in zip(self._metrics(study), values)}
        try:
            added = augur.add_trial(params, metrics)
        except Conflict as e:
            log.warning("Optuna trial %d not added to Augur study %d: %s", trial.number, augur.id, e)
            return
        except AugurError as e:
            log.warning("Optuna trial %d not added to Augur study %d: %s", trial.number, augur.id, e)
            return
        study._storage.set_trial_system_attr(trial._trial_id, STUDY_ATTR, augur.id)
        study._storage.set_trial_system_attr(trial._trial_id, TRIAL_ATTR, added.id)
