//! Multi-fidelity quality bench driver (issue 29): ASHA against full-budget search at equal
//! compute and equal wall-clock, on simulated workers. Usage and output: [`main`].

// The crate root resolves `mod` beside itself; the module lives in `multi_fidelity/`.
#[path = "multi_fidelity/problems.rs"]
mod problems;

use std::collections::BTreeMap;
use std::time::Instant;

use augur_optimizer::multi_fidelity::{Asha, BudgetCap, Fidelity, Hyperband, ModelHistory};
use augur_optimizer::{
    Algorithm, Assignment, Decision, FullBudget, Goal, MetricSpec, Outcome, Policy, SearchSpace,
    StepMeasurement, StudyView, TrialStatus, TrialView, designer_for,
};
use rand::{RngExt, SeedableRng, rngs::StdRng};

use problems::{Checkpoint, LearningCurves, MlpTrainer, Problem};

const FIDELITY: Fidelity = Fidelity {
    min: 1.0,
    max: 27.0,
    reduction_factor: 3.0,
};
const WORKERS: usize = 4;
/// The schedulers' `max_trials`.
const ASHA_TRIALS: u64 = 81;
const METRIC: &str = "loss";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Method {
    AshaRandom,
    AshaGpBandit,
    HyperbandRandom,
    HyperbandGpBandit,
    /// ASHA with the full-budget methods' compute as its `max_budget` and no trial limit.
    AshaRandomCapped,
    AshaGpBanditCapped,
    /// The GP over configuration × budget (`ModelHistory::BudgetFeature`) as the designer.
    AshaGpBudget,
    HyperbandGpBudget,
    AshaGpBudgetCapped,
    /// Hyperband whose GP learns from the highest rung with enough results (BOHB's rule).
    HyperbandGpRung,
    FullGpBandit,
    FullRandom,
}

impl Method {
    const ALL: [Method; 12] = [
        Method::AshaRandom,
        Method::AshaGpBandit,
        Method::HyperbandRandom,
        Method::HyperbandGpBandit,
        Method::AshaRandomCapped,
        Method::AshaGpBanditCapped,
        Method::AshaGpBudget,
        Method::HyperbandGpBudget,
        Method::AshaGpBudgetCapped,
        Method::HyperbandGpRung,
        Method::FullGpBandit,
        Method::FullRandom,
    ];

    fn name(self) -> &'static str {
        match self {
            Method::AshaRandom => "asha_random",
            Method::AshaGpBandit => "asha_gp_bandit",
            Method::HyperbandRandom => "hyperband_random",
            Method::HyperbandGpBandit => "hyperband_gp_bandit",
            Method::AshaRandomCapped => "asha_random_max_budget",
            Method::AshaGpBanditCapped => "asha_gp_bandit_max_budget",
            Method::AshaGpBudget => "asha_gp_budget",
            Method::HyperbandGpBudget => "hyperband_gp_budget",
            Method::AshaGpBudgetCapped => "asha_gp_budget_max_budget",
            Method::HyperbandGpRung => "hyperband_gp_rung",
            Method::FullGpBandit => "full_gp_bandit",
            Method::FullRandom => "full_random",
        }
    }

    /// A scheduler's method (ASHA or Hyperband): its trials start below the full budget.
    fn is_asha(self) -> bool {
        !matches!(self, Method::FullGpBandit | Method::FullRandom)
    }

    /// With `max_budget`: a budget cap instead of `ASHA_TRIALS`.
    fn is_capped(self) -> bool {
        matches!(
            self,
            Method::AshaRandomCapped | Method::AshaGpBanditCapped | Method::AshaGpBudgetCapped
        )
    }

    /// `cap`: the `max_budget` of a capped method.
    fn policy(self, metric: &MetricSpec, cap: f64) -> Box<dyn Policy> {
        let asha =
            |algorithm| Box::new(Asha::new(FIDELITY, metric.clone(), designer_for(algorithm)));
        let asha_budget = || Box::new(Asha::of(FIDELITY, metric.clone(), Algorithm::GpBandit));
        let hyperband =
            |algorithm| Hyperband::new(FIDELITY, metric.clone(), designer_for(algorithm));
        match self {
            Method::AshaRandom => asha(Algorithm::Random),
            Method::AshaGpBandit => asha(Algorithm::GpBandit),
            Method::HyperbandRandom => Box::new(hyperband(Algorithm::Random)),
            Method::HyperbandGpBandit => Box::new(hyperband(Algorithm::GpBandit)),
            Method::AshaGpBudget => asha_budget(),
            Method::HyperbandGpBudget => {
                Box::new(Hyperband::of(FIDELITY, metric.clone(), Algorithm::GpBandit))
            }
            Method::AshaGpBudgetCapped => {
                Box::new(BudgetCap::new(asha_budget(), cap, FIDELITY.rungs()))
            }
            Method::HyperbandGpRung => {
                Box::new(hyperband(Algorithm::GpBandit).with_history(ModelHistory::HighestRung))
            }
            Method::AshaRandomCapped => Box::new(BudgetCap::new(
                asha(Algorithm::Random),
                cap,
                FIDELITY.rungs(),
            )),
            Method::AshaGpBanditCapped => Box::new(BudgetCap::new(
                asha(Algorithm::GpBandit),
                cap,
                FIDELITY.rungs(),
            )),
            Method::FullGpBandit => Box::new(FullBudget::of(Algorithm::GpBandit)),
            Method::FullRandom => Box::new(FullBudget::of(Algorithm::Random)),
        }
    }
}

/// A study's state when one of its trials completed the full budget.
#[derive(Debug, Clone, Copy)]
struct CurvePoint {
    /// Budget units (epochs) consumed so far by all workers, running attempts included.
    compute: f64,
    /// Simulated time.
    wall: f64,
    /// The best loss at the full budget so far.
    best: f64,
}

/// One study's record: of one of our methods, or of a reference optimizer's (read from
/// `--references`, written by `benches/quality/multi_fidelity_reference.py`).
struct Run {
    problem: String,
    /// `Method::name`, or the reference's name (e.g. `optuna_tpe_hyperband`).
    method: String,
    seed: u64,
    trials: usize,
    /// Budget units trained in all.
    compute: f64,
    /// Simulated time until the last attempt ended.
    wall: f64,
    /// Attempts started at each rung (a full-budget trial's only attempt counts at the top).
    attempts: Vec<usize>,
    /// Median and total wall ms of the policy's `decide` calls.
    decide_ms: f64,
    decide_ms_total: f64,
    curve: Vec<CurvePoint>,
}

impl Run {
    /// The best full-budget loss once `compute` budget units were consumed.
    fn best_at_compute(&self, compute: f64) -> f64 {
        self.curve
            .iter()
            .filter(|p| p.compute <= compute * (1.0 + 1e-9))
            .map(|p| p.best)
            .fold(f64::INFINITY, f64::min)
    }

    /// The best full-budget loss at simulated time `wall`.
    fn best_at_wall(&self, wall: f64) -> f64 {
        self.curve
            .iter()
            .filter(|p| p.wall <= wall * (1.0 + 1e-9))
            .map(|p| p.best)
            .fold(f64::INFINITY, f64::min)
    }

    /// The compute consumed when the best full-budget loss first got to `target` (∞: never).
    fn compute_to_reach(&self, target: f64) -> f64 {
        self.curve
            .iter()
            .find(|p| p.best <= target)
            .map_or(f64::INFINITY, |p| p.compute)
    }

    fn final_best(&self) -> f64 {
        self.curve.last().map_or(f64::INFINITY, |p| p.best)
    }

    fn json(&self) -> serde_json::Value {
        let curve: Vec<[f64; 3]> = self
            .curve
            .iter()
            .map(|p| [p.compute, p.wall, p.best])
            .collect();
        serde_json::json!({
            "problem": self.problem, "method": self.method, "seed": self.seed,
            "workers": WORKERS, "trials": self.trials, "compute": self.compute,
            "wall": self.wall, "attempts": self.attempts, "decide_ms": self.decide_ms,
            "decide_ms_total": self.decide_ms_total,
            "curve": curve,
        })
    }
}

/// An attempt under way on a worker.
struct Attempt {
    start: f64,
    end: f64,
    trial: u64,
}

/// A study on simulated workers: each attempt trains only what its trial's checkpoint lacks
/// and lasts as many time units as the epochs it trains.
struct Simulation<'p> {
    problem: &'p dyn Problem,
    trials: Vec<TrialView>,
    /// Each trial's checkpoint, by trial number − 1.
    checkpoints: Vec<Checkpoint>,
    running: Vec<Attempt>,
    clock: f64,
    /// Budget units of the attempts that ended.
    trained: f64,
    best: f64,
    curve: Vec<CurvePoint>,
    attempts: Vec<usize>,
}

impl<'p> Simulation<'p> {
    fn new(problem: &'p dyn Problem) -> Self {
        Simulation {
            problem,
            trials: Vec::new(),
            checkpoints: Vec::new(),
            running: Vec::new(),
            clock: 0.0,
            trained: 0.0,
            best: f64::INFINITY,
            curve: Vec::new(),
            attempts: vec![0; FIDELITY.rungs().len()],
        }
    }

    /// Budget units consumed by now: the ended attempts' and the running ones' so far.
    fn compute_now(&self) -> f64 {
        self.trained
            + self
                .running
                .iter()
                .map(|a| self.clock - a.start)
                .sum::<f64>()
    }

    fn start(&mut self, number: u64, budget: Option<f64>) {
        let index = number as usize - 1;
        let to = budget.unwrap_or(FIDELITY.max);
        let done = self.checkpoints[index].epoch as f64;
        assert!(to > done, "trial {number} would train again what it has");
        let trial = &mut self.trials[index];
        trial.status = TrialStatus::Running;
        trial.budget = budget;
        let rungs = FIDELITY.rungs();
        if let Some(k) = rungs.iter().position(|r| *r == to) {
            self.attempts[k] += 1;
        }
        self.running.push(Attempt {
            start: self.clock,
            end: self.clock + to - done,
            trial: number,
        });
    }

    fn apply(&mut self, decisions: Vec<Decision>) {
        for decision in decisions {
            match decision {
                Decision::New { parameters, budget } => {
                    let number = self.trials.len() as u64 + 1;
                    self.trials.push(TrialView {
                        number,
                        parameters,
                        status: TrialStatus::Running,
                        excluded: false,
                        budget,
                        measurements: Vec::new(),
                        copying_from: None,
                    });
                    self.checkpoints.push(Checkpoint::default());
                    self.start(number, budget);
                }
                Decision::Resume { trial, budget } => {
                    let status = &self.trials[trial as usize - 1].status;
                    assert_eq!(*status, TrialStatus::Paused, "only paused trials resume");
                    self.start(trial, Some(budget));
                }
                Decision::Stop { trial } => {
                    let t = &mut self.trials[trial as usize - 1];
                    assert_eq!(t.status, TrialStatus::Paused, "only paused trials stop");
                    t.status = finished(t);
                }
                Decision::Exploit { .. } => panic!("ASHA and Hyperband never exploit"),
            }
        }
    }

    /// The attempt that ends first ends: its trial trains the epochs it lacks and reports
    /// each, then waits or, at the full budget, completes. False when nothing runs.
    fn end_next(&mut self) -> bool {
        let Some(i) = (0..self.running.len())
            .min_by(|&a, &b| self.running[a].end.total_cmp(&self.running[b].end))
        else {
            return false;
        };
        let attempt = self.running.swap_remove(i);
        self.clock = attempt.end;
        self.trained += attempt.end - attempt.start;
        let index = attempt.trial as usize - 1;
        let t = &mut self.trials[index];
        let to = Fidelity::step(t.budget.unwrap_or(FIDELITY.max));
        let checkpoint = &mut self.checkpoints[index];
        let from = checkpoint.epoch + 1;
        let losses = self.problem.train(&t.parameters, checkpoint, to);
        for (step, loss) in (from..).zip(losses) {
            t.measurements.push(StepMeasurement {
                step,
                metrics: BTreeMap::from([(METRIC.to_string(), loss)]),
            });
        }
        if to as f64 >= FIDELITY.max {
            t.status = finished(t);
            if let Some(m) = t.measurements.last() {
                self.best = self.best.min(m.metrics[METRIC]);
            }
            self.curve.push(CurvePoint {
                compute: self.compute_now(),
                wall: self.clock,
                best: self.best,
            });
        } else {
            t.status = TrialStatus::Paused;
        }
        true
    }
}

fn finished(t: &TrialView) -> TrialStatus {
    let last = t
        .measurements
        .last()
        .map(|m| m.metrics.clone())
        .unwrap_or_default();
    TrialStatus::Finished(Outcome::Measured(last))
}

fn view<'a>(
    space: &'a SearchSpace,
    metrics: &'a [MetricSpec],
    trials: &'a [TrialView],
    max_trials: Option<u64>,
    seed: u64,
    state: Option<&'a serde_json::Value>,
) -> StudyView<'a> {
    StudyView {
        space,
        metrics,
        trials,
        next_trial_number: trials.len() as u64 + 1,
        max_trials,
        seed,
        previous_state: state,
        prior_studies: &[],
        desired_min_safe_trials_fraction: None,
    }
}

/// Runs one study to its end: the policy decides whenever a worker is free.
fn run_study(problem: &dyn Problem, method: Method, seed: u64, full_trials: u64) -> Run {
    let space = problem.space();
    let metrics = [MetricSpec::new(METRIC, Goal::Minimize)];
    let cap = full_trials as f64 * FIDELITY.max;
    let policy = method.policy(&metrics[0], cap);
    let max_trials = if method.is_capped() {
        // Never the limit: the budget is.
        100_000
    } else if method.is_asha() {
        ASHA_TRIALS
    } else {
        full_trials
    };
    let mut sim = Simulation::new(problem);
    let mut state: Option<serde_json::Value> = None;
    let mut decide_ms = Vec::new();
    loop {
        let free = WORKERS - sim.running.len();
        let left = max_trials.saturating_sub(sim.trials.len() as u64) as usize;
        // ASHA knows `max_trials` and also resumes and stops; a full-budget policy only
        // starts trials, as many as the study has left.
        let slots = if method.is_asha() {
            free
        } else {
            free.min(left)
        };
        if slots > 0 {
            let study = view(
                &space,
                &metrics,
                &sim.trials,
                Some(max_trials),
                seed,
                state.as_ref(),
            );
            let started = Instant::now();
            let out = policy.decide(&study, slots);
            decide_ms.push(started.elapsed().as_secs_f64() * 1e3);
            state = out.state.or(state);
            sim.apply(out.decisions);
        }
        if !sim.end_next() {
            break;
        }
    }
    Run {
        problem: problem.name().to_string(),
        method: method.name().to_string(),
        seed,
        trials: sim.trials.len(),
        compute: sim.trained,
        wall: sim.clock,
        attempts: sim.attempts,
        decide_ms: median(&decide_ms),
        decide_ms_total: decide_ms.iter().sum(),
        curve: sim.curve,
    }
}

fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    0.5 * (v[(n - 1) / 2] + v[n / 2])
}

/// The median and a 95% percentile-bootstrap interval of it (10,000 resamples of the
/// seeds, seeded so the table is reproducible).
fn median_ci(values: &[f64]) -> (f64, f64, f64) {
    const DRAWS: usize = 10_000;
    let mut rng = StdRng::seed_from_u64(29);
    let mut medians: Vec<f64> = (0..DRAWS)
        .map(|_| {
            let sample: Vec<f64> = (0..values.len())
                .map(|_| values[rng.random_range(0..values.len())])
                .collect();
            median(&sample)
        })
        .collect();
    medians.sort_by(f64::total_cmp);
    (
        median(values),
        medians[DRAWS * 25 / 1000],
        medians[DRAWS * 975 / 1000],
    )
}

/// Three significant digits; `∞` for never.
fn sig(x: f64) -> String {
    if x.is_infinite() {
        "∞".into()
    } else if x == 0.0 || (1e-3..1e4).contains(&x.abs()) {
        let digits = if x == 0.0 {
            0
        } else {
            (2 - x.abs().log10().floor() as i32).max(0) as usize
        };
        format!("{x:.digits$}")
    } else {
        format!("{x:.2e}")
    }
}

fn cell(values: &[f64]) -> String {
    let (m, lo, hi) = median_ci(values);
    format!("{} [{}–{}]", sig(m), sig(lo), sig(hi))
}

/// Spearman's rank correlation.
fn spearman(a: &[f64], b: &[f64]) -> f64 {
    let ranks = |v: &[f64]| {
        let mut order: Vec<usize> = (0..v.len()).collect();
        order.sort_by(|&i, &j| v[i].total_cmp(&v[j]));
        let mut r = vec![0.0; v.len()];
        for (rank, i) in order.into_iter().enumerate() {
            r[i] = rank as f64;
        }
        r
    };
    let (ra, rb) = (ranks(a), ranks(b));
    let mean = (a.len() as f64 - 1.0) / 2.0;
    let cov: f64 = ra
        .iter()
        .zip(&rb)
        .map(|(x, y)| (x - mean) * (y - mean))
        .sum();
    let var: f64 = ra.iter().map(|x| (x - mean).powi(2)).sum();
    cov / var
}

/// How well each lower rung ranks 200 random configurations as the full budget does, and
/// their full-budget losses' minimum and 10%, 50% and 90% quantiles.
fn rung_correlations(problem: &dyn Problem) -> (Vec<(u64, f64)>, [f64; 4]) {
    let space = problem.space();
    let mut rng = StdRng::seed_from_u64(7);
    let rungs: Vec<u64> = FIDELITY
        .rungs()
        .iter()
        .map(|r| Fidelity::step(*r))
        .collect();
    let curves: Vec<Vec<f64>> = (0..200)
        .map(|_| {
            let a = space.sample_with(|p| p.kind.from_unit(rng.random::<f64>()));
            problem.train(&a, &mut Checkpoint::default(), Fidelity::step(FIDELITY.max))
        })
        .collect();
    let at = |step: u64| -> Vec<f64> { curves.iter().map(|c| c[step as usize - 1]).collect() };
    let top = at(Fidelity::step(FIDELITY.max));
    let correlations = rungs[..rungs.len() - 1]
        .iter()
        .map(|&step| (step, spearman(&at(step), &top)))
        .collect();
    let mut sorted = top;
    sorted.sort_by(f64::total_cmp);
    let quantiles = [0.0, 0.1, 0.5, 0.9].map(|q| sorted[(q * (sorted.len() - 1) as f64) as usize]);
    (correlations, quantiles)
}

/// A trainer resumed from its checkpoint at every rung reports what one run straight to the
/// full budget reports: a promoted trial trains only the epochs it lacks.
fn check_resume_is_exact(problem: &dyn Problem) {
    let space = problem.space();
    let mut rng = StdRng::seed_from_u64(11);
    for _ in 0..3 {
        let a = space.sample_with(|p| p.kind.from_unit(rng.random::<f64>()));
        let mut straight = Checkpoint::default();
        let all = problem.train(&a, &mut straight, Fidelity::step(FIDELITY.max));
        let mut resumed = Checkpoint::default();
        let pieces: Vec<f64> = FIDELITY
            .rungs()
            .iter()
            .flat_map(|r| problem.train(&a, &mut resumed, Fidelity::step(*r)))
            .collect();
        assert_eq!(all, pieces, "{}: resumed curve differs", problem.name());
        assert_eq!(
            straight,
            resumed,
            "{}: resumed weights differ",
            problem.name()
        );
    }
}

/// Wall ms of `Asha::decide` with one free slot on a 10,000-trial view shaped as ASHA leaves
/// it (every rung's top ⌊n/η⌋ went on; 4 trials run): (nothing due, so the policy scans every
/// rung and asks its designer for a new trial; one promotion due) for the random designer,
/// and the first case again with gp_bandit as the designer (`gp_calls` calls), learning
/// from the highest rung (`Asha::new`) and over configuration × budget (`Asha::of`).
fn decide_overhead(calls: usize, gp_calls: usize) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
    const TRIALS: usize = 10_000;
    let curves = LearningCurves {
        full_budget: Fidelity::step(FIDELITY.max),
    };
    let space = curves.space();
    let metrics = [MetricSpec::new(METRIC, Goal::Minimize)];
    let rungs = FIDELITY.rungs();
    let mut rng = StdRng::seed_from_u64(3);
    let ended = TRIALS - WORKERS;
    let points: Vec<Assignment> = (0..TRIALS)
        .map(|_| space.sample_with(|p| p.kind.from_unit(rng.random::<f64>())))
        .collect();
    // Each ended trial's top rung: the best third of each rung's trials went on.
    let mut top = vec![0usize; ended];
    let mut reached: Vec<usize> = (0..ended).collect();
    for k in 1..rungs.len() {
        let below = Fidelity::step(rungs[k - 1]);
        reached.sort_by(|&i, &j| {
            curves
                .loss(&points[i], below)
                .total_cmp(&curves.loss(&points[j], below))
                .then(i.cmp(&j))
        });
        reached.truncate(reached.len() / FIDELITY.reduction_factor as usize);
        for &i in &reached {
            top[i] = k;
        }
    }
    let trial = |i: usize, status: TrialStatus, budget: f64, steps: u64| TrialView {
        number: i as u64 + 1,
        parameters: points[i].clone(),
        status,
        excluded: false,
        budget: Some(budget),
        measurements: (1..=steps)
            .map(|step| StepMeasurement {
                step,
                metrics: BTreeMap::from([(METRIC.to_string(), curves.loss(&points[i], step))]),
            })
            .collect(),
        copying_from: None,
    };
    let mut trials: Vec<TrialView> = (0..ended)
        .map(|i| {
            let budget = rungs[top[i]];
            let mut t = trial(i, TrialStatus::Paused, budget, Fidelity::step(budget));
            if top[i] == rungs.len() - 1 {
                t.status = finished(&t);
            }
            t
        })
        .collect();
    trials.extend((ended..TRIALS).map(|i| trial(i, TrialStatus::Running, rungs[0], 0)));
    let time = |asha: &Asha, trials: &[TrialView], calls: usize, due: bool| -> Vec<f64> {
        (0..calls)
            .map(|c| {
                let study = view(&space, &metrics, trials, None, c as u64, None);
                let started = Instant::now();
                let out = asha.decide(&study, 1);
                let ms = started.elapsed().as_secs_f64() * 1e3;
                let resumed = matches!(out.decisions.first(), Some(Decision::Resume { .. }));
                assert_eq!(resumed, due, "the view is built with {due} promotion due");
                ms
            })
            .collect()
    };
    let asha = |algorithm| Asha::new(FIDELITY, metrics[0].clone(), designer_for(algorithm));
    let none_due = time(&asha(Algorithm::Random), &trials, calls, false);
    let gp = time(&asha(Algorithm::GpBandit), &trials, gp_calls, false);
    let budget_gp = time(
        &Asha::of(FIDELITY, metrics[0].clone(), Algorithm::GpBandit),
        &trials,
        gp_calls,
        false,
    );
    // A trial that just ended rung 0 as well as the best there: it is due at once.
    let best = (0..ended)
        .min_by(|&i, &j| {
            curves
                .loss(&points[i], 1)
                .total_cmp(&curves.loss(&points[j], 1))
        })
        .expect("the view has ended trials");
    let mut due = trial(best, TrialStatus::Paused, rungs[0], 1);
    due.number = TRIALS as u64 + 1;
    trials.push(due);
    let one_due = time(&asha(Algorithm::Random), &trials, calls, true);
    (none_due, one_due, gp, budget_gp)
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// The table for one problem: medians over seeds and their bootstrap intervals.
fn print_table(problem: &dyn Problem, runs: &[Run], full_trials: u64) {
    let by = |m: &str| -> Vec<&Run> { runs.iter().filter(|r| r.method == m).collect() };
    let (asha_random, full_gp) = (
        by(Method::AshaRandom.name()),
        by(Method::FullGpBandit.name()),
    );
    // Ours first, then the references in the order they were read.
    let mut methods: Vec<&str> = Method::ALL.iter().map(|m| m.name()).collect();
    for r in runs {
        if !methods.contains(&r.method.as_str()) {
            methods.push(&r.method);
        }
    }
    let seed_ref = |refs: &[&Run], seed: u64, f: &dyn Fn(&Run) -> f64| -> f64 {
        refs.iter()
            .find(|r| r.seed == seed)
            .map_or(f64::NAN, |r| f(r))
    };
    let target = median(&full_gp.iter().map(|r| r.final_best()).collect::<Vec<_>>());
    let gp_compute = median(&full_gp.iter().map(|r| r.compute).collect::<Vec<_>>());
    let asha_compute = median(&asha_random.iter().map(|r| r.compute).collect::<Vec<_>>());
    let (correlations, quantiles) = rung_correlations(problem);
    let correlations: Vec<String> = correlations
        .iter()
        .map(|(step, rho)| format!("epoch {step} {rho:.2}"))
        .collect();
    println!("\n### {}\n", problem.name());
    let quantiles: Vec<String> = quantiles.iter().map(|q| sig(*q)).collect();
    println!(
        "200 random configurations: loss at 27 epochs min / 10% / 50% / 90% {}; its rank \
         correlation (Spearman) with the loss at {}. Compute references (medians): asha_random {}, full_gp_bandit {} ({full_trials} trials \
         × 27); target = full_gp_bandit's median final loss, {}.\n",
        quantiles.join(" / "),
        correlations.join(", "),
        sig(asha_compute),
        sig(gp_compute),
        sig(target),
    );
    println!(
        "| method | compute | wall | best @ asha_random's compute | best @ ⅓ full_gp's compute \
         | best @ asha_random's wall | final best | compute to reach target | reached | ÷ full_gp's compute |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for method in methods {
        let mine = by(method);
        if mine.is_empty() {
            continue;
        }
        let column = |f: &dyn Fn(&Run) -> f64| -> Vec<f64> { mine.iter().map(|r| f(r)).collect() };
        let to_reach = column(&|r| r.compute_to_reach(target));
        let reached = to_reach.iter().filter(|c| c.is_finite()).count();
        let ratio = median(&to_reach) / gp_compute;
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {reached}/{} | {} |",
            method,
            sig(median(&column(&|r| r.compute))),
            sig(median(&column(&|r| r.wall))),
            cell(&column(&|r| r.best_at_compute(seed_ref(
                &asha_random,
                r.seed,
                &|a| a.compute
            )))),
            cell(&column(&|r| r.best_at_compute(seed_ref(
                &full_gp,
                r.seed,
                &|g| g.compute / 3.0
            )))),
            cell(&column(&|r| r.best_at_wall(seed_ref(
                &asha_random,
                r.seed,
                &|a| a.wall
            )))),
            cell(&column(&|r| r.final_best())),
            cell(&to_reach),
            mine.len(),
            if ratio.is_finite() {
                format!("{ratio:.2}")
            } else {
                "–".into()
            },
        );
    }
    let attempts: Vec<String> = Method::ALL
        .iter()
        .filter(|m| m.is_asha() && !by(m.name()).is_empty())
        .map(|&m| {
            let per_rung: Vec<String> = (0..FIDELITY.rungs().len())
                .map(|k| {
                    sig(median(
                        &by(m.name())
                            .iter()
                            .map(|r| r.attempts[k] as f64)
                            .collect::<Vec<_>>(),
                    ))
                })
                .collect();
            format!("{} {}", m.name(), per_rung.join(" / "))
        })
        .collect();
    println!(
        "\nAttempts per rung (1 / 3 / 9 / 27 epochs, medians): {}.",
        attempts.join("; ")
    );
}

/// The problem named `name` (its full name or a prefix).
fn problem_named(all: &[Box<dyn Problem>], name: &str) -> Option<usize> {
    all.iter().position(|p| p.name().starts_with(name))
}

/// Answer training requests on stdin for the Python references (see the module's doc).
fn serve_oracle(problem: &dyn Problem) {
    use std::io::{BufRead, Write};
    #[derive(serde::Deserialize)]
    struct Request {
        trial: u64,
        parameters: Assignment,
        to: u64,
    }
    let mut checkpoints: BTreeMap<u64, Checkpoint> = BTreeMap::new();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { return };
        let answer = match serde_json::from_str::<Request>(&line) {
            Ok(r) => {
                let checkpoint = checkpoints.entry(r.trial).or_default();
                let losses = problem.train(&r.parameters, checkpoint, r.to);
                serde_json::json!({ "losses": losses })
            }
            Err(e) => serde_json::json!({ "error": e.to_string() }),
        };
        if writeln!(out, "{answer}")
            .and_then(|()| out.flush())
            .is_err()
        {
            return;
        }
    }
}

/// Reference runs from JSON lines files (as `Run::json` writes them).
fn read_references(paths: &str) -> Vec<Run> {
    let mut runs = Vec::new();
    for path in paths.split(',').filter(|p| !p.is_empty()) {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| {
            eprintln!("--references {path}: {e}");
            std::process::exit(2);
        });
        for (i, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| {
                eprintln!("{path}:{}: {e}", i + 1);
                std::process::exit(2);
            });
            let number = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
            let curve = v["curve"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .filter_map(|p| {
                    Some(CurvePoint {
                        compute: p[0].as_f64()?,
                        wall: p[1].as_f64()?,
                        best: p[2].as_f64()?,
                    })
                })
                .collect();
            runs.push(Run {
                problem: v["problem"].as_str().unwrap_or_default().to_string(),
                method: v["method"].as_str().unwrap_or_default().to_string(),
                seed: v["seed"].as_u64().unwrap_or_default(),
                trials: v["trials"].as_u64().unwrap_or_default() as usize,
                compute: number("compute"),
                wall: number("wall"),
                attempts: v["attempts"]
                    .as_array()
                    .map(Vec::as_slice)
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|a| a.as_u64().map(|a| a as usize))
                    .collect(),
                decide_ms: number("decide_ms"),
                decide_ms_total: number("decide_ms_total"),
                curve,
            });
        }
    }
    runs
}

/// Multi-fidelity quality bench driver (issue 29): ASHA against full-budget search at equal
/// compute and equal wall-clock, on simulated workers.
///
/// Each study runs on 4 simulated workers (as `asha/tests.rs`'s `Simulation`): an attempt
/// lasts the epochs it trains, a resumed trial trains only what its checkpoint lacks, and the
/// policy (`Asha` or `FullBudget`, through `Policy::decide` over a `StudyView`, as the service
/// asks it) decides whenever a worker is free. Methods: `asha_random` and `asha_gp_bandit`
/// (and the same with Hyperband: `hyperband_random`, `hyperband_gp_bandit`)
/// (fidelity 1–27 epochs, η = 3, 81 trials), ASHA with the full-budget methods' compute as
/// its `max_budget` and no trial limit (`asha_random_max_budget`, `asha_gp_bandit_max_budget`),
/// the GP over configuration × budget as the designer (`ModelHistory::BudgetFeature`:
/// `asha_gp_budget`, `hyperband_gp_budget`, `asha_gp_budget_max_budget`), Hyperband with
/// BOHB's highest-rung GP (`hyperband_gp_rung`), `full_gp_bandit` and `full_random` (every trial
/// trains 27 epochs; `--full-trials`, 30 by default). Problems (`multi_fidelity/problems.rs`):
/// `curves_hartmann3`, learning curves with Hartmann3's regret as the final loss, and
/// `mlp_two_moons`, an MLP trained by SGD whose validation loss is the metric.
///
/// `cargo run --release -p augur-optimizer --example multi_fidelity -- [--seeds N]
/// [--first-seed S] [--problems a,b] [--methods a,b] [--full-trials N] [--table [--jsonl FILE]]`
/// (`--methods`: only these of ours, with asha_random and full_gp_bandit, which the table
/// pairs every run with)
///
/// Without `--table`: one JSON line per study, `{"problem", "method", "seed", "workers",
/// "trials", "compute", "wall", "attempts": [attempts started per rung], "decide_ms":
/// median wall ms per decide call, "decide_ms_total", "curve": [[compute, wall, best], …]}`, a curve point each
/// time a trial completes the full budget: budget units consumed so far (epochs, summed over
/// workers, running attempts included), simulated time, and the best full-budget loss yet.
/// With `--table`: per problem and method, medians over seeds with a seeded bootstrap 95%
/// interval, and ASHA's decision time with 10,000 trials (the JSON lines go to `--jsonl`);
/// `--references a.jsonl,b.jsonl` adds reference optimizers' runs (the same JSON lines) as
/// rows of their own.
///
/// `--oracle PROBLEM` trains for another program instead (the Python references,
/// `benches/quality/multi_fidelity_reference.py`): each line read, `{"trial": N,
/// "parameters": {…}, "to": E}`, trains trial N on from its checkpoint to epoch E and answers
/// `{"losses": [the metric after each new epoch]}`, so that every optimizer trains the same
/// problems, bit for bit.
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let number = |name: &str, default: u64| -> u64 {
        arg(&args, name).map_or(default, |s| {
            s.parse().unwrap_or_else(|_| {
                eprintln!("{name}: not a number: {s}");
                std::process::exit(2);
            })
        })
    };
    let seeds = number("--seeds", 10);
    let first_seed = number("--first-seed", 0);
    let full_trials = number("--full-trials", 30);
    let table = args.iter().any(|a| a == "--table");
    let jsonl = arg(&args, "--jsonl");
    let wanted = arg(&args, "--problems").unwrap_or_else(|| "all".into());
    // The reference methods (asha_random, full_gp_bandit) are always run: the table pairs
    // every run with theirs.
    let methods = arg(&args, "--methods")
        .map(|m| format!("{m},asha_random,full_gp_bandit"))
        .unwrap_or_else(|| "all".into());
    let all: Vec<Box<dyn Problem>> = vec![
        Box::new(LearningCurves {
            full_budget: Fidelity::step(FIDELITY.max),
        }),
        Box::new(MlpTrainer::new()),
    ];
    if let Some(name) = arg(&args, "--oracle") {
        let Some(i) = problem_named(&all, &name) else {
            eprintln!("--oracle {name}: no such problem");
            std::process::exit(2);
        };
        return serve_oracle(all[i].as_ref());
    }
    let mut references = arg(&args, "--references")
        .map(|paths| read_references(&paths))
        .unwrap_or_default();
    let problems: Vec<&dyn Problem> = all
        .iter()
        .map(|p| p.as_ref())
        .filter(|p| wanted == "all" || wanted.split(',').any(|w| p.name().starts_with(w)))
        .collect();
    let mut lines = Vec::new();
    let mut tables = Vec::new();
    for &problem in &problems {
        check_resume_is_exact(problem);
        let mut runs = Vec::new();
        for method in Method::ALL
            .into_iter()
            .filter(|m| methods == "all" || methods.split(',').any(|w| w == m.name()))
        {
            for seed in first_seed..first_seed + seeds {
                let run = run_study(problem, method, seed, full_trials);
                if table {
                    lines.push(run.json().to_string());
                } else {
                    println!("{}", run.json());
                }
                runs.push(run);
            }
        }
        let (theirs, rest): (Vec<Run>, Vec<Run>) = references
            .into_iter()
            .partition(|r| r.problem == problem.name());
        references = rest;
        runs.extend(theirs);
        tables.push((problem, runs));
    }
    if !table {
        return;
    }
    if let Some(path) = jsonl {
        let mut text = lines.join("\n");
        text.push('\n');
        if let Err(e) = std::fs::write(&path, text) {
            eprintln!("--jsonl {path}: {e}");
            std::process::exit(1);
        }
    }
    println!(
        "Seeds {first_seed}–{}, {WORKERS} workers; ASHA: fidelity 1–27 epochs, η 3, {ASHA_TRIALS} \
         trials; full budget: {full_trials} trials × 27 epochs. Cells: median over seeds \
         [bootstrap 95% interval]; compute in epochs, wall in simulated epoch-times; the target \
         is full_gp_bandit's median final loss.",
        first_seed + seeds - 1
    );
    for (problem, runs) in &tables {
        print_table(*problem, runs, full_trials);
    }
    let (none_due, one_due, gp, budget_gp) = decide_overhead(200, 5);
    let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    println!(
        "\n### ASHA's decision time, 10,000 trials in the view (one free slot)\n\n\
         | case | calls | median ms | max ms |\n|---|---|---|---|\n\
         | nothing due, random designer | {} | {:.3} | {:.3} |\n\
         | one promotion due | {} | {:.3} | {:.3} |\n\
         | nothing due, gp_bandit designer (highest rung) | {} | {:.1} | {:.1} |\n\
         | nothing due, gp_bandit designer (configuration × budget) | {} | {:.1} | {:.1} |",
        none_due.len(),
        median(&none_due),
        max(&none_due),
        one_due.len(),
        median(&one_due),
        max(&one_due),
        gp.len(),
        median(&gp),
        max(&gp),
        budget_gp.len(),
        median(&budget_gp),
        max(&budget_gp),
    );
}
