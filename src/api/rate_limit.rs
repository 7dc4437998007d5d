//! A per-token rate limit (`augur serve --rate-limit N`): each caller (a token's name, or
//! `open`) may send `N` requests a second on average, in bursts of up to `2N`; past that it
//! is answered `429` with `Retry-After`. Off unless configured. Kept per process: with
//! several replicas behind a balancer, a caller may send up to `N` a second to each.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::error::ApiError;

/// Buckets not seen for this long are dropped when the table grows past `PRUNE_AT`.
const IDLE_SECS: f64 = 60.0;
const PRUNE_AT: usize = 10_000;

#[derive(Clone, Default)]
pub struct RateLimit {
    /// Requests per second per caller; `None`: no limit.
    per_second: Option<f64>,
    /// Each caller's bucket: tokens left and when it was last filled.
    buckets: Arc<Mutex<HashMap<String, (f64, Instant)>>>,
}

impl RateLimit {
    pub fn new(per_second: Option<f64>) -> Self {
        Self {
            per_second: per_second.filter(|r| r.is_finite() && *r > 0.0),
            buckets: Arc::default(),
        }
    }

    /// Take one request from `caller`'s bucket, or say how long until one is there.
    pub fn admit(&self, caller: &str) -> Result<(), ApiError> {
        let Some(rate) = self.per_second else {
            return Ok(());
        };
        let burst = (2.0 * rate).max(1.0);
        let now = Instant::now();
        let Ok(mut buckets) = self.buckets.lock() else {
            return Ok(());
        };
        if buckets.len() >= PRUNE_AT {
            buckets.retain(|_, (_, at)| now.duration_since(*at).as_secs_f64() < IDLE_SECS);
        }
        let (tokens, at) = buckets.entry(caller.to_string()).or_insert((burst, now));
        *tokens = (*tokens + now.duration_since(*at).as_secs_f64() * rate).min(burst);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Ok(())
        } else {
            let wait = ((1.0 - *tokens) / rate).ceil().max(1.0) as u64;
            Err(ApiError::TooManyRequests {
                retry_after_secs: wait,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caller_gets_its_burst_then_waits_and_others_are_not_affected() {
        let limit = RateLimit::new(Some(5.0));
        for _ in 0..10 {
            assert!(limit.admit("a").is_ok());
        }
        match limit.admit("a") {
            Err(ApiError::TooManyRequests { retry_after_secs }) => assert_eq!(retry_after_secs, 1),
            other => panic!("{other:?}"),
        }
        assert!(limit.admit("b").is_ok());
        assert!(RateLimit::new(None).admit("a").is_ok());
    }
}
