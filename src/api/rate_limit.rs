//! Two limits, each a token bucket per key, answered `429` with `Retry-After` past it: per
//! token (`--rate-limit`), and per source address on failed tokens.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::Extensions;
use axum::http::request::Parts;

use super::error::ApiError;

/// Buckets not seen for this long are dropped when the table grows past `PRUNE_AT`.
const IDLE_SECS: f64 = 60.0;
const PRUNE_AT: usize = 10_000;
/// Failed token checks an address may make in a row.
pub const FAILURE_BURST: f64 = 10.0;
/// Then one more every this many seconds.
pub const FAILURE_REFILL_SECS: f64 = 6.0;

/// Token buckets by key: `rate` tokens a second, at most `burst` held.
#[derive(Clone)]
struct Buckets {
    rate: f64,
    burst: f64,
    /// Each key's bucket: tokens left and when it was last filled.
    table: Arc<Mutex<HashMap<String, (f64, Instant)>>>,
}

impl Buckets {
    fn new(rate: f64, burst: f64) -> Self {
        Self {
            rate,
            burst,
            table: Arc::default(),
        }
    }

    /// Take `cost` tokens from `key`'s bucket when it holds at least one (a cost of 0 only
    /// looks), or say how many seconds until it does.
    fn take(&self, key: &str, cost: f64) -> Result<(), u64> {
        let now = Instant::now();
        let Ok(mut table) = self.table.lock() else {
            return Ok(());
        };
        if table.len() >= PRUNE_AT {
            table.retain(|_, (_, at)| now.duration_since(*at).as_secs_f64() < IDLE_SECS);
        }
        let (tokens, at) = table.entry(key.to_string()).or_insert((self.burst, now));
        *tokens = (*tokens + now.duration_since(*at).as_secs_f64() * self.rate).min(self.burst);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= cost;
            Ok(())
        } else {
            Err(((1.0 - *tokens) / self.rate).ceil().max(1.0) as u64)
        }
    }
}

fn too_many(retry_after_secs: u64) -> ApiError {
    ApiError::TooManyRequests { retry_after_secs }
}

/// Two limits, each a token bucket per key, answered `429` with `Retry-After` past it:
/// - per token (`augur serve --rate-limit N`): each caller (a token's name, or `open`) may
///   send `N` requests a second on average, in bursts of up to `2N`. Off unless configured.
/// - per source address, on failures (always on): an address that sent [`FAILURE_BURST`]
///   unknown or expired tokens (bearer, cookie or the login form) may try again once every
///   [`FAILURE_REFILL_SECS`] seconds; meanwhile every token it sends is refused before it is
///   looked at, a right one too (else a guess that hits would still be told so). Clients
///   behind one proxy share its address: one of them guessing slows the others' sign-ins.
///
/// Both are kept per process: with several replicas behind a balancer, a caller may send up
/// to the limit to each.
#[derive(Clone, Default)]
pub struct RateLimit {
    /// `None`: no limit.
    buckets: Option<Buckets>,
}

impl RateLimit {
    /// `per_second` requests a second per caller, in bursts of twice that; `None`: no limit.
    pub fn new(per_second: Option<f64>) -> Self {
        let buckets = per_second
            .filter(|r| r.is_finite() && *r > 0.0)
            .map(|rate| Buckets::new(rate, (2.0 * rate).max(1.0)));
        Self { buckets }
    }

    /// Take one request from `caller`'s bucket, or say how long until one is there.
    pub fn admit(&self, caller: &str) -> Result<(), ApiError> {
        match &self.buckets {
            Some(buckets) => buckets.take(caller, 1.0).map_err(too_many),
            None => Ok(()),
        }
    }
}

/// Failed token checks per source address (see the module's header).
#[derive(Clone)]
pub struct FailureLimit {
    buckets: Buckets,
}

impl Default for FailureLimit {
    fn default() -> Self {
        Self {
            buckets: Buckets::new(1.0 / FAILURE_REFILL_SECS, FAILURE_BURST),
        }
    }
}

impl FailureLimit {
    /// Refuse a token from `source` while it is past its failures; an unknown source (a
    /// request that did not come through `serve`) is never refused.
    pub fn check(&self, source: Option<IpAddr>) -> Result<(), ApiError> {
        match source {
            Some(ip) => self.buckets.take(&ip.to_string(), 0.0).map_err(too_many),
            None => Ok(()),
        }
    }

    /// `source` sent a token that is no token of this server's.
    pub fn record_failure(&self, source: Option<IpAddr>) {
        if let Some(ip) = source {
            let _ = self.buckets.take(&ip.to_string(), 1.0);
        }
    }
}

/// The address a request came from, as `serve` recorded it.
pub fn source_address(extensions: &Extensions) -> Option<IpAddr> {
    extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(addr)| addr.ip())
}

/// [`source_address`] for a handler; never rejects.
pub struct SourceAddress(pub Option<IpAddr>);

impl<S: Send + Sync> FromRequestParts<S> for SourceAddress {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(SourceAddress(source_address(&parts.extensions)))
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

    #[test]
    fn an_address_is_refused_after_its_failures_only() {
        let limit = FailureLimit::default();
        let (a, b) = (Some([10, 0, 0, 1].into()), Some([10, 0, 0, 2].into()));
        for _ in 0..100 {
            assert!(
                limit.check(a).is_ok(),
                "checks without failures cost nothing"
            );
        }
        for _ in 0..FAILURE_BURST as usize {
            assert!(limit.check(a).is_ok());
            limit.record_failure(a);
        }
        match limit.check(a) {
            Err(ApiError::TooManyRequests { retry_after_secs }) => {
                assert_eq!(retry_after_secs, FAILURE_REFILL_SECS as u64)
            }
            other => panic!("{other:?}"),
        }
        assert!(limit.check(b).is_ok());
        assert!(limit.check(None).is_ok());
    }
}
