//! Quality bench driver: Augur's designers on the public suite, one JSON line per study.
//! Usage and output: [`main`].

use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

use augur_optimizer::test_functions::{MIXED_SUITE, SUITE};
use augur_optimizer::{
    Algorithm, Assignment, Designer, FullBudget, Goal, GpBanditConfig, GpBanditDesigner,
    MetricSpec, Outcome, ParameterKind, Policy, SearchSpace, StudyView, TrialStatus, TrialView,
    Value, designer_for,
};

/// A box function or a mixed-space problem, as the bench sees it.
struct Problem {
    name: &'static str,
    space: SearchSpace,
    f: Box<dyn Fn(&Assignment) -> f64>,
    optimum: f64,
    budget: usize,
}

fn problems() -> Vec<Problem> {
    let mut out: Vec<Problem> = SUITE
        .iter()
        .map(|f| {
            let f = *f;
            Problem {
                name: f.name,
                space: f.space(),
                f: Box::new(move |a| f.evaluate(a)),
                optimum: f.optimum,
                budget: f.budget,
            }
        })
        .collect();
    out.extend(MIXED_SUITE.iter().map(|f| {
        let f = *f;
        Problem {
            name: f.name,
            space: (f.space)(),
            f: Box::new(move |a| (f.f)(a)),
            optimum: f.optimum,
            budget: f.budget,
        }
    }));
    out
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// A study's best-so-far regret and wall ms per trial, and each trial's parameters.
struct Study {
    regret: Vec<f64>,
    ms: Vec<f64>,
    points: Vec<Assignment>,
}

/// Initial points per (function, seed), from `--designs`.
type Designs = BTreeMap<(String, u64), Vec<Vec<f64>>>;

fn read_designs(path: &str) -> Result<Designs, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let mut designs = Designs::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let row: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("{path}: {e}"))?;
        let (Some(function), Some(seed)) = (row["function"].as_str(), row["seed"].as_u64()) else {
            return Err(format!("{path}: a line without function and seed"));
        };
        let points: Vec<Vec<f64>> = serde_json::from_value(row["x"].clone())
            .map_err(|e| format!("{path}: x of {function} seed {seed}: {e}"))?;
        designs.insert((function.to_string(), seed), points);
    }
    Ok(designs)
}

/// A design's points must be coordinates `x0, x1, …` of a box function, inside its box.
fn check_design(f: &Problem, design: &[Vec<f64>]) -> Result<(), String> {
    if design.is_empty() {
        return Ok(());
    }
    let dim = f.space.parameters.len();
    let is_box = f
        .space
        .parameters
        .iter()
        .enumerate()
        .all(|(i, p)| p.id == format!("x{i}"));
    if !is_box {
        return Err("designs are for box functions (parameters x0, x1, …) only".into());
    }
    for x in design {
        if x.len() != dim {
            return Err(format!(
                "a point has {} coordinates, the box {dim}",
                x.len()
            ));
        }
        let inside = x
            .iter()
            .zip(&f.space.parameters)
            .all(|(v, p)| match p.kind {
                ParameterKind::Double { min, max, .. } => (min..=max).contains(v),
                _ => false,
            });
        if !inside {
            return Err(format!("{x:?} is outside the box"));
        }
    }
    Ok(())
}

/// A study under way: its finished trials (what the policy learns from) and what the JSON
/// line reports.
struct Recorder<'a> {
    f: &'a Problem,
    finished: Vec<TrialView>,
    state: Option<serde_json::Value>,
    best: f64,
    study: Study,
}

impl<'a> Recorder<'a> {
    fn new(f: &'a Problem) -> Self {
        Recorder {
            f,
            finished: Vec::new(),
            state: None,
            best: f64::INFINITY,
            study: Study {
                regret: Vec::new(),
                ms: Vec::new(),
                points: Vec::new(),
            },
        }
    }

    /// Ask `policy` for `count` points numbered from `first_trial_number`, with `pending`
    /// running; the points and the wall time per point.
    fn ask(
        &mut self,
        policy: &dyn Policy,
        seed: u64,
        pending: &[Assignment],
        count: usize,
        first_trial_number: u64,
    ) -> (Vec<Assignment>, f64) {
        let metrics = [MetricSpec {
            id: "y".into(),
            goal: Goal::Minimize,
            safety_threshold: None,
        }];
        let running = pending.iter().map(|parameters| TrialView {
            number: 0,
            parameters: parameters.clone(),
            status: TrialStatus::Running,
            excluded: false,
            budget: None,
            measurements: Vec::new(),
            copying_from: None,
        });
        let trials: Vec<TrialView> = self.finished.iter().cloned().chain(running).collect();
        let study = StudyView {
            space: &self.f.space,
            metrics: &metrics,
            trials: &trials,
            next_trial_number: first_trial_number,
            max_trials: None,
            seed,
            previous_state: self.state.as_ref(),
            prior_studies: &[],
            desired_min_safe_trials_fraction: None,
        };
        let start = Instant::now();
        let out = policy.decide(&study, count);
        let elapsed = start.elapsed().as_secs_f64() * 1e3;
        self.state = out.state.clone().or(self.state.take());
        let points = out.new_points();
        let per = elapsed / points.len().max(1) as f64;
        (points, per)
    }

    /// Measure a trial and record it; `ms` is the wall time its suggestion took.
    fn measure(&mut self, a: Assignment, ms: f64) {
        let y = (self.f.f)(&a);
        self.best = self.best.min(y);
        self.study.regret.push(self.best - self.f.optimum);
        self.study.ms.push(ms);
        self.study.points.push(a.clone());
        self.finished.push(TrialView {
            number: self.finished.len() as u64 + 1,
            parameters: a,
            status: TrialStatus::Finished(Outcome::Measured(BTreeMap::from([(
                "y".to_string(),
                y,
            )]))),
            excluded: false,
            budget: None,
            measurements: Vec::new(),
            copying_from: None,
        });
    }
}

/// A study in batches of `parallel` suggested together, after the `design` points.
fn run(policy: &dyn Policy, f: &Problem, seed: u64, parallel: usize, design: &[Vec<f64>]) -> Study {
    let mut r = Recorder::new(f);
    for x in design.iter().take(f.budget) {
        let a: Assignment = x
            .iter()
            .enumerate()
            .map(|(i, v)| (format!("x{i}"), Value::Float(*v)))
            .collect();
        r.measure(a, 0.0);
    }
    while r.finished.len() < f.budget {
        let count = parallel.min(f.budget - r.finished.len());
        let first = r.finished.len() as u64 + 1;
        let (points, per) = r.ask(policy, seed, &[], count, first);
        if points.is_empty() {
            break;
        }
        for a in points {
            r.measure(a, per);
        }
    }
    r.study
}

/// Like [`run`], but as `workers` workers that each ask for one trial when theirs ends: every
/// suggestion sees the other workers' trials as pending, and the oldest trial ends first.
fn run_workers(policy: &dyn Policy, f: &Problem, seed: u64, workers: usize) -> Study {
    let mut r = Recorder::new(f);
    let mut pending: VecDeque<(Assignment, f64)> = VecDeque::new();
    let mut asked = 0;
    while r.finished.len() < f.budget {
        while pending.len() < workers.max(1) && asked < f.budget {
            let others: Vec<Assignment> = pending.iter().map(|(a, _)| a.clone()).collect();
            let (points, ms) = r.ask(policy, seed, &others, 1, asked as u64 + 1);
            let Some(a) = points.into_iter().next() else {
                break;
            };
            pending.push_back((a, ms));
            asked += 1;
        }
        let Some((a, ms)) = pending.pop_front() else {
            break;
        };
        r.measure(a, ms);
    }
    r.study
}

/// A box function's trials as coordinate vectors `x0, x1, …` (`None` for a mixed space).
fn coordinates(points: &[Assignment]) -> Option<Vec<Vec<f64>>> {
    points
        .iter()
        .map(|a| {
            (0..a.len())
                .map(|i| a.get(&format!("x{i}")).and_then(|v| v.as_f64()))
                .collect()
        })
        .collect()
}

/// Quality bench driver: runs Augur's designers, through the full-budget policy the service
/// asks (`FullBudget::decide` over a `StudyView`), on the public
/// suite (see `shared/reference/README.md`) and prints one JSON line per study:
/// `{"optimizer", "function", "parallel", "seed", "regret": [best-so-far regret per trial],
/// "ms": [wall ms per suggest call, divided by the suggestions it returned]}`.
///
/// `cargo run --release --example quality -- [--seeds N] [--first-seed S] [--functions a,b]
/// [--algorithms a,b] [--parallel 1,5] [--gp knob=value,… --label name] [--points]
/// [--designs FILE] [--workers]`.
/// `--workers` runs each study as `parallel` workers that each ask for one trial when theirs
/// ends, the others' trials pending (as `augur worker`s or ask/tell clients do, the oldest
/// finishing first), instead of batches of `parallel` suggested together; its lines are
/// labelled `<algorithm>_workers` unless `--label` names them.
/// `--points` adds `"x"`: each trial's coordinates in order (box functions only), and for
/// gp_bandit `"initial"`: how many of them were its quasi-random design, which
/// `benches/quality/same_design.py` starts the Python references from. `--designs FILE`
/// does the converse: a study whose function and seed have a line `{"function", "seed",
/// "x": [[x0, x1, …], …]}` there starts with those points as its first trials (measured in
/// one batch, counted in the budget; with `--gp max_initial_trials=k` for k of them
/// gp_bandit adds no quasi-random points of its own). `benches/quality/run` aggregates these lines with the Python references.
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let seeds: u64 = arg(&args, "--seeds")
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let first_seed: u64 = arg(&args, "--first-seed")
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    // GP-bandit knob overrides (`GpBanditConfig::with_overrides`) and a name for the runs.
    let gp_overrides = arg(&args, "--gp");
    let label = arg(&args, "--label");
    let with_points = args.iter().any(|a| a == "--points");
    let workers = args.iter().any(|a| a == "--workers");
    let designs = match arg(&args, "--designs")
        .map(|p| read_designs(&p))
        .transpose()
    {
        Ok(designs) => designs.unwrap_or_default(),
        Err(e) => {
            eprintln!("--designs: {e}");
            std::process::exit(2);
        }
    };
    let functions = arg(&args, "--functions").unwrap_or_else(|| "all".into());
    let algorithms =
        arg(&args, "--algorithms").unwrap_or_else(|| "gp_bandit,quasi_random,random".into());
    let parallel: Vec<usize> = arg(&args, "--parallel")
        .unwrap_or_else(|| "1,5".into())
        .split(',')
        .filter_map(|p| p.trim().parse().ok())
        .collect();
    for f in problems()
        .iter()
        .filter(|f| functions == "all" || functions.split(',').any(|n| n == f.name))
    {
        for name in algorithms.split(',') {
            let Ok(algorithm) = serde_json::from_value::<Algorithm>(serde_json::json!(name)) else {
                eprintln!("unknown algorithm {name}");
                continue;
            };
            // gp_bandit's config, also for the size of its quasi-random design.
            let gp_config = match (&gp_overrides, algorithm) {
                (_, a) if a != Algorithm::GpBandit => None,
                (None, _) => Some(GpBanditConfig::default()),
                (Some(o), _) => match GpBanditConfig::default().with_overrides(o) {
                    Ok(config) => Some(config),
                    Err(e) => {
                        eprintln!("--gp: {e}");
                        std::process::exit(2);
                    }
                },
            };
            let designer: Box<dyn Designer> = match &gp_config {
                Some(config) => Box::new(GpBanditDesigner {
                    config: config.clone(),
                }),
                None => designer_for(algorithm),
            };
            let policy = FullBudget::new(designer);
            for &p in &parallel {
                for seed in first_seed..first_seed + seeds {
                    let design = designs
                        .get(&(f.name.to_string(), seed))
                        .map_or(&[][..], Vec::as_slice);
                    if let Err(e) = check_design(f, design) {
                        eprintln!("--designs: {} seed {seed}: {e}", f.name);
                        std::process::exit(2);
                    }
                    let (study, optimizer) = if workers {
                        let label = label.clone().unwrap_or_else(|| format!("{name}_workers"));
                        (run_workers(&policy, f, seed, p), label)
                    } else {
                        let label = label.clone().unwrap_or_else(|| name.to_string());
                        (run(&policy, f, seed, p, design), label)
                    };
                    let mut line = serde_json::json!({
                        "optimizer": optimizer, "function": f.name, "parallel": p, "seed": seed,
                        "regret": study.regret, "ms": study.ms,
                    });
                    if with_points && let Some(x) = coordinates(&study.points) {
                        line["x"] = serde_json::json!(x);
                        // Its quasi-random trials: a batch begun during the design is
                        // all quasi-random, so whole batches.
                        if let Some(config) = &gp_config {
                            let k = config.initial_trials(f.space.parameters.len());
                            line["initial"] = serde_json::json!(k.div_ceil(p) * p);
                        }
                    }
                    println!("{line}");
                }
            }
        }
    }
}
