//! Waiting for what happens in the background: `eventually` polls a check until it
//! holds or a time limit passes; `until_replicas_live` waits for replicas to see each other.

use std::time::{Duration, Instant};

use super::client::metric_sample;

/// Poll `check` every 50 ms until it gives `Ok`, failing after `limit` with `what` and the
/// last `Err` it gave (what was seen instead).
pub async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let start = Instant::now();
    loop {
        match check().await {
            Ok(value) => return value,
            Err(seen) => assert!(
                start.elapsed() < limit,
                "{what} not within {limit:?}: {seen}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Wait until every replica at `bases` sees `n` live replicas (`augur_replicas_live`; each
/// renews its lease and reads the others' every 2 s).
pub async fn until_replicas_live(bases: &[&str], token: Option<&str>, n: f64) {
    eventually(
        "replicas see each other",
        Duration::from_secs(15),
        || async {
            for base in bases {
                let live = metric_sample(base, token, "augur_replicas_live").await;
                if live != n {
                    return Err(format!("{base} sees {live} live replicas"));
                }
            }
            Ok(())
        },
    )
    .await;
}
