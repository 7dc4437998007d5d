//! Latency of one GP-bandit suggestion (`Designer::suggest`, count 1) at d = 2, 10, 20 with
//! 10, 100 and 1,000 completed trials on a Levy-like objective, without a warm start (the
//! worst case). Targets (DESIGN.md §6): p50 ≤ 50 ms at 100 trials and ≤ 1 s at 1,000 for d = 10.
//!
//! `cargo bench -p augur-optimizer --bench suggest` (release, one thread).

use std::hint::black_box;
use std::time::Duration;

use augur_optimizer::test_functions::levy_history;
use augur_optimizer::{DesignerInput, Goal, MetricSpec, designer_for};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};

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
        for n in [10usize, 100, 1000] {
            let (space, completed) = levy_history(d, n as u64);
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
    let (space10, completed) = levy_history(10, 100);
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
