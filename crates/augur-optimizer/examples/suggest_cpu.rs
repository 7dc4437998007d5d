//! CPU time of one GP-bandit suggestion (count 1, no warm start), as the suggestion-latency
//! targets count it (DESIGN.md §6). Usage and output: [`main`].

use augur_optimizer::Designer;
use augur_optimizer::test_functions::levy_history;
use augur_optimizer::{DesignerInput, Goal, GpBanditConfig, GpBanditDesigner, MetricSpec};

/// On-CPU nanoseconds of this thread so far (first field of schedstat).
fn thread_cpu_ns() -> Option<u64> {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// CPU time of one GP-bandit suggestion (count 1, no warm start), as the suggestion-latency
/// targets count it (DESIGN.md §6: p50 ≤ 50 ms at 100 trials, ≤ 1 s at 1,000, d = 10, one
/// core). Wall clock on a shared machine counts other processes' time too; the suggesting
/// thread's own CPU time (`/proc/thread-self/schedstat`, Linux) does not, but on some
/// kernels it advances in scheduler ticks (4 ms here), so the wall-clock median of a quiet
/// machine is printed too.
///
/// `cargo run --release -p augur-optimizer --example suggest_cpu [-- REPEATS [KNOBS
/// [PENDING]]]` (KNOBS: `GpBanditConfig::with_overrides`, e.g. `refine_starts=0`, may be
/// empty; several sets separated by `;` are measured interleaved, one suggestion of each
/// per seed, so that a change in the machine's load hits them alike; PENDING: that many of
/// the history's points also running, 0 by default, e.g. 4 for the last member of a batch
/// of 5, a Thompson draw with `batch_thompson_every=5`): the same Levy-scored quasi-random
/// histories as `benches/suggest.rs` (d = 10; 100 and 1,000 trials), each suggestion from a
/// cold start (a different seed each time), and prints per knob set the median and maximum
/// CPU ms and the median wall-clock ms.
fn main() {
    let repeats: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(15)
        .max(1);
    let d = 10;
    let metrics = [MetricSpec {
        id: "y".into(),
        goal: Goal::Minimize,
        safety_threshold: None,
    }];
    let knob_sets: Vec<String> = std::env::args()
        .nth(2)
        .unwrap_or_default()
        .split(';')
        .map(str::to_string)
        .collect();
    let mut designers = Vec::new();
    for knobs in &knob_sets {
        match GpBanditConfig::default().with_overrides(knobs) {
            Ok(config) => designers.push(GpBanditDesigner { config }),
            Err(e) => {
                eprintln!("knobs: {e}");
                std::process::exit(2);
            }
        }
    }
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
        // Per knob set: CPU ms and wall-clock ms of each suggestion.
        let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); designers.len()];
        let mut wall: Vec<Vec<f64>> = vec![Vec::new(); designers.len()];
        for seed in 0..repeats {
            for (k, designer) in designers.iter().enumerate() {
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
                let clock = std::time::Instant::now();
                let (Some(before), out, Some(after)) =
                    (thread_cpu_ns(), designer.suggest(&input), thread_cpu_ns())
                else {
                    eprintln!("/proc/thread-self/schedstat is not readable here");
                    return;
                };
                wall[k].push(clock.elapsed().as_secs_f64() * 1e3);
                std::hint::black_box(out);
                cpu[k].push((after - before) as f64 / 1e6);
            }
        }
        for (k, knobs) in knob_sets.iter().enumerate() {
            let max = cpu[k].iter().copied().fold(0.0, f64::max);
            println!(
                "d={d} trials={n} [{knobs}]: CPU ms per suggestion median {:.1}, max {max:.1}; wall ms median {:.1} ({repeats} cold suggestions)",
                median(&mut cpu[k]),
                median(&mut wall[k]),
            );
        }
    }
}
