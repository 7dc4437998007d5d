//! CPU time of one GP-bandit suggestion (count 1, no warm start), as the suggestion-latency
//! targets count it (DESIGN.md §6: p50 ≤ 50 ms at 100 trials, ≤ 1 s at 1,000, d = 10, one
//! core). Wall clock on a shared machine counts other processes' time too; the suggesting
//! thread's own CPU time (`/proc/thread-self/schedstat`, Linux) does not.
//!
//! `cargo run --release -p augur-optimizer --example suggest_cpu [-- REPEATS [KNOBS
//! [PENDING]]]` (KNOBS: `GpBanditConfig::with_overrides`, e.g. `refine_starts=3`, may be
//! empty; PENDING: that many of the history's points also running, 0 by default, e.g. 4
//! for the last member of a batch of 5, a Thompson draw with `batch_thompson_every=5`): the same
//! Levy-scored quasi-random histories as `benches/suggest.rs` (d = 10; 100 and 1,000
//! trials), each suggestion from a cold start (a different seed each time), and prints the
//! median and maximum CPU ms.

use augur_optimizer::test_functions::levy_history;
use augur_optimizer::{
    Algorithm, Designer, DesignerInput, Goal, GpBanditConfig, GpBanditDesigner, MetricSpec,
    designer_for,
};

/// On-CPU nanoseconds of this thread so far (first field of schedstat).
fn thread_cpu_ns() -> Option<u64> {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn main() {
    let repeats: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(15);
    let d = 10;
    let metrics = [MetricSpec {
        id: "y".into(),
        goal: Goal::Minimize,
        safety_threshold: None,
    }];
    let designer: Box<dyn Designer> = match std::env::args().nth(2) {
        Some(knobs) => match GpBanditConfig::default().with_overrides(&knobs) {
            Ok(config) => Box::new(GpBanditDesigner { config }),
            Err(e) => {
                eprintln!("knobs: {e}");
                std::process::exit(2);
            }
        },
        None => designer_for(Algorithm::GpBandit),
    };
    let running: usize = std::env::args()
        .nth(3)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    for n in [100u64, 1000] {
        let (space, completed) = levy_history(d, n);
        let pending: Vec<_> = completed
            .iter()
            .take(running)
            .map(|t| t.parameters.clone())
            .collect();
        let mut ms: Vec<f64> = Vec::new();
        for seed in 0..repeats {
            let input = DesignerInput {
                space: &space,
                metrics: &metrics,
                completed: &completed,
                pending: &pending,
                count: 1,
                first_trial_number: n + running as u64 + 1,
                seed,
                previous_state: None,
                prior_studies: &[],
                desired_min_safe_trials_fraction: None,
            };
            let (Some(before), out, Some(after)) =
                (thread_cpu_ns(), designer.suggest(&input), thread_cpu_ns())
            else {
                eprintln!("/proc/thread-self/schedstat is not readable here");
                return;
            };
            std::hint::black_box(out);
            ms.push((after - before) as f64 / 1e6);
        }
        ms.sort_by(f64::total_cmp);
        let median = ms[ms.len() / 2];
        let max = ms[ms.len() - 1];
        println!(
            "d={d} trials={n}: CPU ms per suggestion median {median:.1}, max {max:.1} ({repeats} cold suggestions)"
        );
    }
}
