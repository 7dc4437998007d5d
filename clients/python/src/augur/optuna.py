"""An Optuna sampler whose suggestions come from an Augur study: Optuna code runs unchanged
but for ``sampler=AugurSampler(client, ...)``.

How it works (Optuna's sampler protocol, all of it through *independent* sampling):

- The first trial in a process, when no Augur study of that name exists yet, *discovers*
  the search space: its values come from a fallback sampler (random by default) while the
  objective names its parameters. When it finishes, the Augur study is created from the
  distributions it asked for (float and int with ``log``, ``step`` as discrete values,
  categorical), placed as the rule below says, and the trial is added to it as a completed
  trial. Other threads of the process wait for it meanwhile.
- Every later trial is one Augur trial, suggested with a ``client_id`` of its own (so the
  call is safe to retry) and held with a heartbeat while the objective runs; each
  ``suggest_*`` call decodes that trial's value. When the objective returns, the trial is
  completed in Augur with the objective's value(s) (failed when the objective failed, and
  completed with its last intermediate value when it was pruned, intermediate values being
  sent as measurements).
- **Define-by-run spaces grow.** When the objective asks for a parameter the Augur trial
  has no value for (one the study lacks, a conditional one whose branch the earlier trials
  did not take, or one added after the trial was handed out), the value comes from the
  fallback sampler, and the Augur study learns it: the parameter is added to the study's
  search space (``POST /v1/studies/{study}/parameters``) and the trial records its value,
  so the trial counts in Augur with every value it ran with. Where a new parameter goes:

  * under the **last parameter asked before it in the same trial that can be a parent**: a
    categorical, or an integer with at most :data:`MAX_PARENT_VALUES` values (a switch
    such as ``n_layers``, not a size such as ``units``), as a child active when that
    parent takes the value it has in this trial. ``if trial.suggest_categorical("optimizer",
    [...]) == "sgd": trial.suggest_float("momentum", ...)`` makes ``momentum`` a child of
    ``optimizer`` under ``sgd``;
  * at the top level (in every trial from then on) when no such parameter was asked before
    it, or with ``conditional=False``;
  * a child asked later under another value of its parent (``momentum`` for ``rmsprop``)
    has that value added to those that activate it (a child in Augur may hang under several
    values of its parent), again recorded for the trial that revealed it. A parameter stays
    where it was first placed: its later asks use that parent.

  The rule sees the order of the asks, not the ``if``: a parameter asked after a
  categorical whatever its value (``lr`` after ``optimizer`` in every trial) is placed under
  the value of the first trial, and widened to each other value as trials take it, each
  once from the fallback sampler, until it is active under all of them. Code like that runs
  a few more fallback values with ``conditional=True`` (the default), and none with
  ``conditional=False`` (where, instead, a branch's parameters are suggested in every
  trial, used or not).
- Several processes, on several machines, share one Augur study by naming it: the first to
  finish a trial creates it, the others find it by name (and grow it in the same way: adding
  what is there is a no-op, and values added by two processes add up). Augur's cap
  (``parallel_trials``) holds across all of them: a thread waits while it is full. When the
  study's budget (``max_trials``) is spent, the Optuna study is stopped and the trial that
  asked is pruned.
- **An existing study's trials come along.** When the sampler finds an Augur study of that
  name, its finished trials are added to the Optuna study (``study.add_trial``, with their
  values, intermediate values and distributions read from the Augur spec), once: so
  ``study.best_value``, ``study.best_params`` and ``study.trials_dataframe()`` see them. Its
  own trials then follow as usual (trials other processes finish later are in Augur, not in
  this process's Optuna study, unless they share an Optuna storage). A study that is no
  longer active (completed, stopped, failed) runs no trial: the trial that found it is
  pruned and the Optuna study stopped, and the log says how to run more trials on it or to
  start a fresh one.
- **The study ends when the process is done with it.** Optuna does not tell a sampler when
  ``optimize`` returns, so the study is ended by :meth:`AugurSampler.finish`, called by
  ``with AugurSampler(...) as sampler:`` on exit, or at the latest when the interpreter
  exits. It *completes* the Augur study by lowering ``max_trials`` to the trials it has
  (reversible: raise it to run more), and only when that is safe for other processes: never
  while any trial of the study is unfinished (another process runs it, and its own finish
  ends the study), never when a trial came from a client other than an ``AugurSampler``,
  and, when other processes took part, only once the study has been quiet (no trial
  created or changed) for ``end_grace_secs``. A process can still be unseen: one whose
  discovery trial is running (it is not an Augur trial yet), or, rarely, one between two
  trials. So a sampler that finds its study completed by another process *after it began*,
  below its own ``max_trials``, raises the budget back and goes on (and ends the study
  again when it finishes); a study completed before the sampler began is done: its trials
  are loaded and nothing runs. ``end_study=False`` leaves the study active; so does a
  ``with`` block left by an exception (Ctrl-C included), whereas a script without one that
  dies ends its study at exit like any other (raise ``max_trials`` to go on).

Not supported (each raises :class:`UnsupportedSearchSpace` or ``ValueError``): a parameter
asked with another distribution than the one the study has for it; categorical choices whose
string forms clash (``1`` and ``"1"``); an Augur study of the same name with other
objectives; a grid study's space growing. Enqueued trials (``study.enqueue_trial``) are run
with their given values and added to Augur as completed trials (their new parameters added
first).
"""

from __future__ import annotations

import ast
import atexit
import logging
import math
import os
import secrets
import socket
import threading
import time
import weakref
from datetime import datetime
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set

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
from ._http import RetryPolicy
from .errors import AugurError, Conflict, InvalidArgument

__all__ = [
    "AugurSampler",
    "UnsupportedSearchSpace",
    "augur_parameter",
    "MAX_DISCRETE_VALUES",
    "MAX_PARENT_VALUES",
]

log = logging.getLogger("augur.optuna")

#: A stepped distribution with at most this many values becomes a ``discrete`` parameter;
#: a larger one a ``double``/``integer`` whose values are rounded to the step.
MAX_DISCRETE_VALUES = 1000

#: An integer parameter with at most this many values may be the parent of parameters
#: asked after it (``n_layers``); one with more is a size, not a switch.
MAX_PARENT_VALUES = 16

#: Optuna system attributes set on each trial: the Augur study and trial it ran as.
STUDY_ATTR = "augur:study_id"
TRIAL_ATTR = "augur:trial_id"
#: Set on the trials added to the Optuna study from an existing Augur study.
LOADED_ATTR = "augur:loaded"

#: Trial states of an Augur study in which a trial still runs (or is about to).
UNFINISHED = ("requested", "active", "stopping")


class UnsupportedSearchSpace(ValueError):
    """The objective asked for a parameter that the Augur study's search space cannot give
    (another distribution than the study's, or a space that may not grow)."""


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
    """The fields of a parameter spec that define its domain (not its children), with the
    server's defaults filled in."""
    kind = param.get("type")
    out: Dict[str, Any] = {"type": kind}
    if kind in ("double", "integer"):
        out.update(min=float(param["min"]), max=float(param["max"]),
                   scale=param.get("scale") or "linear")
    else:
        out["values"] = [float(v) if kind == "discrete" else v for v in param.get("values") or []]
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


def _can_parent(distribution: BaseDistribution) -> bool:
    """Whether parameters asked after one of this distribution may be its children."""
    if isinstance(distribution, CategoricalDistribution):
        return len(distribution.choices) > 1
    if isinstance(distribution, IntDistribution):
        count = (distribution.high - distribution.low) // distribution.step + 1
        return 1 < count <= MAX_PARENT_VALUES
    return False


def _choice_of(code: str) -> Any:
    """A categorical value as Optuna had it, from its string form (see
    :func:`_category_codes`): ``"True"`` → ``True``, ``"3"`` → ``3``, strings as they are.
    For a study's trials whose distributions this process has not seen."""
    try:
        value = ast.literal_eval(code)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return code
    if isinstance(value, (bool, int, float, type(None))) and str(value) == code:
        return value
    return code


def _distribution_of(param: Mapping[str, Any]) -> BaseDistribution:
    """The Optuna distribution of an Augur parameter spec (the inverse of
    :func:`augur_parameter`, as far as the spec tells)."""
    kind = param.get("type")
    log_scale = param.get("scale") == "log"
    if kind == "double":
        return FloatDistribution(float(param["min"]), float(param["max"]), log=log_scale)
    if kind == "integer":
        return IntDistribution(int(param["min"]), int(param["max"]), log=log_scale)
    values = list(param.get("values") or [])
    if kind == "discrete":
        if len(values) > 1:
            steps = {round(b - a, 12) for a, b in zip(values, values[1:])}
            if len(steps) == 1:
                step = steps.pop()
                if all(isinstance(v, int) for v in values) and float(step).is_integer():
                    return IntDistribution(values[0], values[-1], step=int(step))
                return FloatDistribution(float(values[0]), float(values[-1]), step=float(step))
        return CategoricalDistribution(values)
    return CategoricalDistribution([_choice_of(v) for v in values])


def _params_of(spec: Mapping[str, Any]) -> Dict[str, Dict[str, Any]]:
    """Every parameter of an Augur spec's tree, by id, each with ``parent`` (the parent's id,
    or ``None`` at the top level)."""
    out: Dict[str, Dict[str, Any]] = {}

    def walk(params: Sequence[Mapping[str, Any]], parent: Optional[str]) -> None:
        for p in params:
            out[p["id"]] = {**p, "parent": parent}
            for child in p.get("children") or []:
                walk(child.get("parameters") or [], p["id"])

    walk(spec.get("parameters") or [], None)
    return out


def _loaded_value(code: Any, distribution: BaseDistribution, name: str) -> Any:
    """A stored Augur value as the distribution's value, also for a categorical of numbers
    (uneven discrete values), which Augur keeps as numbers, not string forms."""
    if isinstance(distribution, CategoricalDistribution) and not isinstance(code, str):
        for choice in distribution.choices:
            if isinstance(choice, (int, float)) and not isinstance(choice, bool) and choice == code:
                return choice
    return _decode(code, distribution, name)


def _server_time(stamp: Any) -> Optional[float]:
    """An RFC 3339 time of the server (any number of fractional digits) as a POSIX time."""
    if not isinstance(stamp, str):
        return None
    text = stamp.strip().replace("Z", "+00:00")
    whole, dot, rest = text.partition(".")
    if dot:
        digits = "".join(c for c in rest if c.isdigit())
        text = f"{whole}.{digits[:6]}{rest[len(digits):]}"
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


class _Stop(Exception):
    """The Augur study ended: no more trials."""


#: The samplers of this process that may still have a study to end at exit.
_samplers: "weakref.WeakSet[AugurSampler]" = weakref.WeakSet()


@atexit.register
def _finish_at_exit() -> None:
    """At interpreter exit, :meth:`AugurSampler.finish` every sampler not finished yet."""
    for sampler in list(_samplers):
        sampler._finish(at_exit=True)


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
        algorithm: ``gp_bandit`` (default), ``random`` or ``quasi_random`` (``grid`` too,
            for a space that does not grow).
        seed: The Augur study's seed (and the fallback sampler's).
        spec: Further fields of the Augur study spec, e.g. ``{"trial_lease_secs": 120}``.
        fallback_sampler: Samples the discovery trial, enqueued trials' missing values and
            the first values of parameters the study learns as the objective reveals them;
            ``RandomSampler(seed)`` by default.
        poll_secs: How often a waiting thread looks for the Augur study another process is
            creating.
        conditional: Place a new parameter under the last categorical (or small integer)
            parameter asked before it in its trial (see the module's docs); ``False``: every
            parameter at the top level.
        end_study: End (complete) the Augur study at :meth:`finish`, when that is safe for
            other processes (see the module's docs); ``False`` leaves it active.
        end_grace_secs: When other processes took part in the study, how long it must have
            been quiet before :meth:`finish` ends it.
        load_trials: Add an existing Augur study's finished trials to the Optuna study.
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
        conditional: bool = True,
        end_study: bool = True,
        end_grace_secs: float = 3.0,
        load_trials: bool = True,
    ) -> None:
        self.client = client
        self.study_name = study_name
        self.max_trials = int(max_trials)
        self.parallel_trials = int(parallel_trials)
        self.algorithm = algorithm
        self.seed = seed
        self.extra_spec = dict(spec or {})
        self.poll_secs = poll_secs
        self.conditional = conditional
        self.end_study = end_study
        self.end_grace_secs = float(end_grace_secs)
        self.load_trials = load_trials
        self._fallback = fallback_sampler or RandomSampler(seed=seed)
        self._client_prefix = f"optuna-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self._cond = threading.Condition()
        self._augur: Optional[_client.Study] = None
        #: The Augur study's parameters by id, each with its ``parent`` (see `_params_of`).
        self._params: Dict[str, Dict[str, Any]] = {}
        #: Distributions the objective asked in this process, for the trials loaded.
        self._seen: Dict[str, BaseDistribution] = {}
        self._discovering: Optional[int] = None
        self._held: Dict[int, _client.Trial] = {}
        self._local: set[int] = set()
        #: Augur trials this process ran or added.
        self._ran: Set[int] = set()
        self._ended = False
        self._ended_why = "its budget is spent or it was stopped"
        self._finished = False
        self._last_find = -math.inf
        #: When this sampler was first asked for a value (``time.time()``).
        self._began: Optional[float] = None
        _samplers.add(self)

    def __enter__(self) -> "AugurSampler":
        return self

    def __exit__(self, exc_type: Optional[type], *exc: object) -> None:
        # On an exception (Ctrl-C too) the study stays active: running the script again
        # goes on with it.
        self._finish(at_exit=False, end=exc_type is None)

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
            self._seen.setdefault(param_name, param_distribution)
            if self._began is None:
                self._began = time.time()
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
                        f"Augur study {self._augur.id if self._augur else '?'} has ended: "
                        f"{self._ended_why}"
                    ) from None
            if held is None:
                with self._cond:
                    self._local.add(tid)
        if held is not None:
            return self._held_value(study, trial, held, param_name, param_distribution)
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
                self._finish_trial(study, trial, held, state, values)
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

    # -- the end ------------------------------------------------------------------------------

    def finish(self) -> None:
        """This process is done with the study: release any trial still held, and end
        (complete) the Augur study when ``end_study`` is set and that is safe for other
        processes (see the module's docs). Called by ``with AugurSampler(...)`` on a clean
        exit, and at interpreter exit; a second call does nothing, unless trials ran since."""
        self._finish(at_exit=False)

    def _finish(self, *, at_exit: bool, end: bool = True) -> None:
        with self._cond:
            if self._finished:
                return
            self._finished = True
            augur = self._augur
            held = list(self._held.values())
            ran = set(self._ran)
        for trial in held:
            trial.release()
        if augur is None or not end or not self.end_study or not ran:
            return
        # At interpreter exit the server may be gone: one try each, no backing off.
        client = self.client._with_retry(RetryPolicy(max_retries=0)) if at_exit else self.client
        try:
            self._end(_client.Study(client, augur.data), ran)
        except Exception as e:  # never fail a finished run over its epilogue
            log.warning("could not end Augur study %d: %s (it stays active; its budget can be "
                        "lowered with Study.update(max_trials=...))", augur.id, e)

    def _end(self, augur: _client.Study, ran: Set[int]) -> None:
        """Complete the study by lowering its budget to the trials it has, when safe."""
        checked_others = False
        for _ in range(5):
            augur.refresh()
            if augur.state != "active":
                return
            counts = augur.trial_counts
            running = sum(int(counts.get(state, 0)) for state in UNFINISHED)
            if running:
                log.info("Augur study %d stays active: %d of its trials still run elsewhere "
                         "(the last process to finish ends it)", augur.id, running)
                return
            total = int(counts.get("total", 0))
            if total > len(ran):
                if not checked_others:
                    foreign = [t for t in augur.trials()
                               if t.data.get("client_id")
                               and not str(t.data["client_id"]).startswith("optuna-")]
                    if foreign:
                        log.info("Augur study %d stays active: trial %d came from %r, not an "
                                 "AugurSampler", augur.id, foreign[0].id,
                                 foreign[0].data.get("client_id"))
                        return
                    checked_others = True
                # Other processes took part: end only once none has touched it for a while.
                mark = augur.data.get("updated_at")
                time.sleep(self.end_grace_secs)
                augur.refresh()
                if augur.data.get("updated_at") != mark:
                    continue
            augur.update(max_trials=max(1, total))
            log.info("ended Augur study %d %r with its %d trials (max_trials lowered to %d; "
                     "raise it to run more)", augur.id, augur.name, total, max(1, total))
            return
        log.info("Augur study %d stays active: other processes keep changing it", augur.id)

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
            if self._ended:
                raise _Stop
        augur = self._augur
        assert augur is not None
        client_id = f"{self._client_prefix}-{trial._trial_id}"
        while True:
            suggestions = augur.suggest(1, client_id)
            if suggestions:
                held = suggestions[0]
                break
            if suggestions.ended:
                if self._reopened(augur.refresh()):
                    continue
                with self._cond:
                    self._ended = True
                    self._ended_why = f"it is {suggestions.study_state} (its budget is spent " \
                        "or it was stopped)"
                raise _Stop
            time.sleep(float(suggestions.retry_after_secs or 1))
        with self._cond:
            self._held[trial._trial_id] = held
            self._ran.add(held.id)
            self._finished = False  # trials run after a finish(): the next one ends them
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
        self._params = _params_of(augur.spec)
        self._augur = augur
        if self.load_trials:
            self._load(study, augur)
        if augur.state != "active" and not self._reopened(augur):
            self._ended = True
            self._ended_why = self._why_not_active(augur)
            log.warning("%s", self._ended_why)
        log.info("running on Augur study %d %r", augur.id, augur.name)

    def _reopened(self, augur: _client.Study) -> bool:
        """Raise the budget of a study another process ended under this one's feet, and say
        whether it is active again: one completed after this sampler began, with a budget
        below this sampler's ``max_trials`` (lowered by that process's :meth:`finish`, while
        this one was discovering the space or between two trials, unseen). A study that
        ended before this sampler began is done (it is loaded, not run); one whose budget is
        this sampler's was spent."""
        if augur.state != "completed" or self._began is None:
            return False
        budget = int(augur.spec.get("max_trials") or 0)
        ended = _server_time(augur.data.get("updated_at"))
        if budget >= self.max_trials or ended is None or ended < self._began:
            return False
        try:
            augur.update(max_trials=self.max_trials)
        except AugurError as e:
            log.warning("could not reopen Augur study %d, ended by another process: %s",
                        augur.id, e)
            return False
        log.info("reopened Augur study %d (max_trials %d again): another process ended it "
                 "while this one still ran", augur.id, self.max_trials)
        return augur.state == "active"

    def _why_not_active(self, augur: _client.Study) -> str:
        counts = augur.trial_counts
        loaded = (
            f"its {counts.get('total', 0)} trials are in this Optuna study (study.best_value, "
            "study.trials_dataframe()), and no new trial runs"
            if self.load_trials else "no new trial runs"
        )
        fresh = (
            f"for a fresh study, give AugurSampler another study_name, or delete this one "
            f"(augur study delete {augur.id})"
        )
        head = f"Augur study {augur.id} {augur.name!r} is {augur.state}"
        if augur.state == "completed":
            return (
                f"{head} (max_trials {augur.spec.get('max_trials')}): {loaded}. To run more "
                f"trials on it, raise its budget (augur.Client(url).study({augur.id})"
                f".update(max_trials=...)); {fresh}"
            )
        if augur.state == "failed":
            reason = augur.data.get("state_reason") or "too many trials failed"
            return (
                f"{head} ({reason}): {loaded}. To run it again: augur study resume {augur.id} "
                f"(raise max_failed_trials first if it says so); {fresh}"
            )
        return f"{head} and does not run again: {loaded}; {fresh}"

    def _create(self, study: OptunaStudy, trial: FrozenTrial) -> None:
        """Create (or find) the Augur study from the discovery trial's distributions, each
        placed by the parent rule in the order the trial asked them."""
        top: List[Dict[str, Any]] = []
        placed: Dict[str, Dict[str, Any]] = {}
        for name, dist in trial.distributions.items():
            if dist.single():
                continue
            node = augur_parameter(name, dist)
            parent = self._parent_for(trial, name, lambda p: p in placed)
            if parent is None:
                top.append(node)
            else:
                groups = placed[parent["id"]].setdefault("children", [])
                group = next((g for g in groups if g["when"] == parent["values"]), None)
                if group is None:
                    groups.append({"when": parent["values"], "parameters": [node]})
                else:
                    group["parameters"].append(node)
            placed[name] = node
        spec: Dict[str, Any] = {
            "name": self._name(study),
            "algorithm": self.algorithm,
            "metrics": self._metrics(study),
            "parameters": top,
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

    # -- the search space ----------------------------------------------------------------------

    def _check_param(self, name: str, distribution: BaseDistribution) -> None:
        """A parameter the study has must be asked with the distribution it was added with."""
        with self._cond:
            have = self._params.get(name)
        if have is None:
            return
        wanted = augur_parameter(name, distribution)
        if _normal(have) != _normal(wanted):
            raise UnsupportedSearchSpace(
                f"parameter {name!r} is {distribution} here, but {_normal(have)} in Augur study "
                f"{self._augur.id if self._augur else '?'}: a parameter's distribution must not "
                "change once the study has it"
            )

    def _parent_for(
        self, trial: FrozenTrial, name: str, known: Any
    ) -> Optional[Dict[str, Any]]:
        """Where the parent rule puts a new parameter ``name``: ``{"id", "values": [v]}`` for
        the last parameter asked before it in ``trial`` that can be a parent (and that
        ``known`` says the study has), or ``None`` for the top level."""
        if not self.conditional:
            return None
        earlier: List[str] = []
        for asked in trial.params:
            if asked == name:
                break
            earlier.append(asked)
        for asked in reversed(earlier):
            dist = trial.distributions.get(asked)
            if dist is None or dist.single() or not _can_parent(dist) or not known(asked):
                continue
            return {"id": asked, "values": [_encode(trial.params[asked], dist, asked)]}
        return None

    def _held_value(
        self,
        study: OptunaStudy,
        trial: FrozenTrial,
        held: _client.Trial,
        name: str,
        distribution: BaseDistribution,
    ) -> Any:
        """The Augur trial's value for ``name``; when it has none, the fallback sampler's,
        which the study learns (the parameter added or widened, and recorded for the
        trial)."""
        self._check_param(name, distribution)
        if name in held.parameters:
            return _decode(held.parameters[name], distribution, name)
        value = self._fallback.sample_independent(study, trial, name, distribution)
        code = _encode(value, distribution, name)
        if self._grow(trial, name, distribution, held, code):
            held.data.setdefault("parameters", {})[name] = code
        return value

    def _value_in(
        self, trial: FrozenTrial, held: Optional[_client.Trial], name: str
    ) -> Optional[Any]:
        """A parameter's value in this trial, as Augur takes it: as the objective got it, or
        as Augur suggested it (asked or not)."""
        if name in trial.params:
            return _encode(trial.params[name], trial.distributions[name], name)
        if held is not None:
            return held.parameters.get(name)
        return None

    def _grow(
        self,
        trial: FrozenTrial,
        name: str,
        distribution: BaseDistribution,
        held: Optional[_client.Trial] = None,
        code: Any = None,
    ) -> bool:
        """Make the study's space give ``name`` in this trial: add it (by the parent rule),
        or add its parent's value in this trial to those that activate it; with a ``held``
        trial, record ``code`` as its value there. Whether Augur has the value now (without
        a held trial: whether the space gives it)."""
        augur = self._augur
        assert augur is not None
        wanted = augur_parameter(name, distribution)
        for attempt in range(2):
            with self._cond:
                have = self._params.get(name)
            parent: Optional[Dict[str, Any]]
            if have is None:
                with self._cond:
                    known = set(self._params)
                parent = self._parent_for(trial, name, known.__contains__)
            elif have["parent"] is None:
                if held is None:
                    return True  # a top-level parameter: every trial has it
                parent = None
            else:
                value = self._value_in(trial, held, have["parent"])
                if value is None:
                    log.warning(
                        "parameter %r is a child of %r in Augur study %d, which trial %d did "
                        "not set: its value there is the fallback sampler's, unknown to Augur",
                        name, have["parent"], augur.id, trial.number)
                    return False
                parent = {"id": have["parent"], "values": [value]}
            trials = {held.id: code} if held is not None else None
            try:
                answer = augur.add_parameter(wanted, parent, trials=trials)
            except Conflict as e:
                field = e.field or ""
                if field.startswith("parent") and attempt == 0:
                    # Another process placed it meanwhile: use where it is.
                    self._refresh_space(augur)
                    continue
                if field.startswith("trials"):
                    log.warning("Augur trial %d keeps no value for %r: %s", held.id if held else 0,
                                name, e.message)
                    return False
                if field.startswith("parameter"):
                    self._refresh_space(augur)
                    raise UnsupportedSearchSpace(
                        f"parameter {name!r} is {distribution} here, but Augur study {augur.id} "
                        f"has it otherwise: a parameter's distribution must not change once "
                        f"the study has it ({e.message})"
                    ) from None
                raise UnsupportedSearchSpace(
                    f"Augur study {augur.id} cannot take parameter {name!r}: {e.message}"
                ) from None
            except InvalidArgument as e:
                if (e.field or "").startswith("trials"):
                    log.warning("Augur trial %d keeps no value for %r: %s", held.id if held else 0,
                                name, e.message)
                    return False
                raise UnsupportedSearchSpace(
                    f"Augur study {augur.id} refused parameter {name!r} "
                    f"(field {e.field}): {e.message}"
                ) from None
            with self._cond:
                self._params = _params_of(answer.spec)
            where = f"under {parent['id']} = {parent['values'][0]!r}" if parent else "top-level"
            log.info("Augur study %d has parameter %r %s", augur.id, name, where)
            return True
        return False

    def _refresh_space(self, augur: _client.Study) -> None:
        fresh = _client.Study(augur.client, augur.data).refresh()
        with self._cond:
            self._params = _params_of(fresh.spec)

    # -- trials --------------------------------------------------------------------------------

    def _finish_trial(
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
        asked = [(n, d) for n, d in trial.distributions.items() if not d.single()]
        for name, dist in asked:
            self._check_param(name, dist)
            self._grow(trial, name, dist)
        params = {name: _encode(trial.params[name], dist, name) for name, dist in asked}
        metrics = {m["id"]: v for m, v in zip(self._metrics(study), values)}
        try:
            added = augur.add_trial(params, metrics)
        except AugurError as e:
            log.warning("Optuna trial %d not added to Augur study %d: %s", trial.number, augur.id, e)
            return
        with self._cond:
            self._ran.add(added.id)
        study._storage.set_trial_system_attr(trial._trial_id, STUDY_ATTR, augur.id)
        study._storage.set_trial_system_attr(trial._trial_id, TRIAL_ATTR, added.id)

    def _load(self, study: OptunaStudy, augur: _client.Study) -> None:
        """Add the Augur study's finished trials to the Optuna study, those it has not yet
        (by their ``augur:trial_id``)."""
        present = {
            t.system_attrs.get(TRIAL_ATTR)
            for t in study.get_trials(deepcopy=False)
            if t.system_attrs.get(STUDY_ATTR) == augur.id
        }
        params = _params_of(augur.spec)
        metrics = self._metrics(study)
        loaded = 0
        for t in augur.trials():
            if t.id in present or t.state in UNFINISHED:
                continue
            distributions: Dict[str, BaseDistribution] = {}
            values: Dict[str, Any] = {}
            for name, code in t.parameters.items():
                if name not in params:
                    continue
                dist = self._seen.get(name) or _distribution_of(params[name])
                distributions[name] = dist
                values[name] = _loaded_value(code, dist, name)
            final = t.metrics or {}
            complete = t.state == "completed" and all(m["id"] in final for m in metrics)
            intermediate = {}
            if len(metrics) == 1:
                for m in t.measurements:
                    v = (m.get("metrics") or {}).get(metrics[0]["id"])
                    if v is not None and math.isfinite(v):
                        intermediate[int(m.get("step", 0))] = float(v)
            try:
                frozen = optuna.trial.create_trial(
                    state=TrialState.COMPLETE if complete else TrialState.FAIL,
                    params=values,
                    distributions=distributions,
                    values=[final[m["id"]] for m in metrics] if complete else None,
                    intermediate_values=intermediate,
                    system_attrs={STUDY_ATTR: augur.id, TRIAL_ATTR: t.id, LOADED_ATTR: True},
                )
                study.add_trial(frozen)
            except (ValueError, UnsupportedSearchSpace) as e:
                log.warning("Augur trial %d not loaded into the Optuna study: %s", t.id, e)
                continue
            loaded += 1
        if loaded:
            log.info("loaded %d finished trials of Augur study %d into Optuna study %r", loaded,
                     augur.id, study.study_name)
