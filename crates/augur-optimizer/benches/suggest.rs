//! Latency of one GP-bandit suggestion (`Designer::suggest`, count 1) at d = 2, 10, 20 with
//! 10, 100 and 1,000 completed trials on a Levy-like objective, without a warm start (the
//! worst case: the service may hand back the previous state, which makes fits cheaper).
//! Targets (DESIGN.md §6): p50 ≤ 50 ms at 100 trials and ≤ 1 s at 1,000 for d = 10.
//!
//! `cargo bench -p augur-optimizer --bench suggest` (release, one thread).

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Duration;

use augur_optimizer::test_functions::levy;
use augur_optimizer::{
    CompletedTrial, DesignerInput, Goal, MetricSpec, Outcome, Parameter, ParameterKind, Scale,
    SearchSpace, designer_for,
};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};

fn space(d: usize) -> SearchSpace {
    SearchSpace {
        parameters: (0..d)
            .map(|i| Parameter {
                id: format!("x{i}"),
                kind: ParameterKind::Double {
                    min: -10.0,
                    max: 10.0,
                    scale: Scale::Linear,
                },
                children: vec![],
            })
            .collect(),
    }
}

/// `n` completed trials at quasi-random points, scored by Levy.
fn history(space: &SearchSpace, d: usize, n: usize) -> Vec<CompletedTrial> {
    (0..n as u64)
        .map(|k| {
            let a = augur_optimizer::quasi_random::quasi_random_assignment(space, 7, k);
            let x: Vec<f64> = (0..d)
                .map(|i| a[&format!("x{i}")].as_f64().unwrap_or(0.0))
                .collect();
            CompletedTrial {
                parameters: a,
                outcome: Outcome::Measured(BTreeMap::from([("y".to_string(), levy(&x))])),
            }
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let metrics = [MetricSpec {
        id: "y".into(),
        goal: Goal::Minimize,
        safety_threshold: None,
    }];
    let designer = designer_for(augur_optimizer::Algorithm::GpBandit);
    let mut group = c.benchmark_group("gp_bandit_suggest");
    group.sample_size(10);
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(3));
    for d in [2usize, 10, 20] {
        let space = space(d);
        for n in [10usize, 100, 1000] {
            let completed = history(&space, d, n);
            group.bench_with_input(BenchmarkId::new(format!("d{d}"), n), &n, |b, _| {
                b.iter(|| {
                    let input = DesignerInput {
                        space: &space,
                        metrics: &metrics,
                        completed: &completed,
                        pending: &[],
                        count: 1,
                        first_trial_number: n as u64 + 1,
                        seed: 1,
                        previous_state: None,
                        prior_studies: &[],
                        desired_min_safe_trials_fraction: None,
                    };
                    black_box(designer.suggest(&input))
                })
            });
        }
    }
    // The service hands back the previous suggestion's fitted hyperparameters: the
    // common case once a study runs.
    let space10 = space(10);
    let completed = history(&space10, 10, 100);
    let first = |state: Option<&serde_json::Value>| {
        designer.suggest(&DesignerInput {
            space: &space10,
            metrics: &metrics,
            completed: &completed,
            pending: &[],
            count: 1,
            first_trial_number: 101,
            seed: 1,
            previous_state: state,
            prior_studies: &[],
            desired_min_safe_trials_fraction: None,
        })
    };
    let state = first(None).state;
    group.bench_function("d10/100_warm", |b| {
        b.iter(|| black_box(first(state.as_ref())))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
