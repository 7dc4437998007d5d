//! Ports for the replicas of local clusters: each is free on this machine when handed out
//! (the kernel picks it) and held in this process until its cluster ends, so two clusters
//! running at once never get the same one.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use super::executor::ExecutorError;

/// Ports held by running clusters of this process.
#[derive(Clone, Default)]
pub struct PortRegistry {
    held: Arc<Mutex<BTreeSet<u16>>>,
}

/// Ports of one cluster, given back when dropped.
pub struct PortLease {
    pub ports: Vec<u16>,
    held: Arc<Mutex<BTreeSet<u16>>>,
}

impl Drop for PortLease {
    fn drop(&mut self) {
        if let Ok(mut held) = self.held.lock() {
            for port in &self.ports {
                held.remove(port);
            }
        }
    }
}

/// Tries per port before giving up: a port another cluster holds is skipped.
const TRIES: usize = 64;

impl PortRegistry {
    /// `n` distinct loopback ports, free now and held by no other cluster of this process.
    pub fn reserve(&self, n: usize) -> Result<PortLease, ExecutorError> {
        let mut held = self
            .held
            .lock()
            .map_err(|_| ExecutorError::Launch("port registry poisoned".into()))?;
        let mut ports = Vec::with_capacity(n);
        while ports.len() < n {
            let port = (0..TRIES)
                .find_map(|_| {
                    let port = std::net::TcpListener::bind(("127.0.0.1", 0))
                        .and_then(|l| l.local_addr())
                        .ok()?
                        .port();
                    (!held.contains(&port)).then_some(port)
                })
                .ok_or_else(|| ExecutorError::Launch("no free port for a replica".into()))?;
            held.insert(port);
            ports.push(port);
        }
        Ok(PortLease {
            ports,
            held: self.held.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clusters_running_at_once_never_share_a_port_and_release_them_at_the_end() {
        let registry = PortRegistry::default();
        let leases: Vec<PortLease> = (0..20)
            .map(|_| registry.reserve(4).expect("ports"))
            .collect();
        let all: Vec<u16> = leases.iter().flat_map(|l| l.ports.clone()).collect();
        let distinct: BTreeSet<u16> = all.iter().copied().collect();
        assert_eq!(distinct.len(), all.len());
        assert_eq!(registry.held.lock().map(|h| h.len()).unwrap_or(0), 80);
        drop(leases);
        assert_eq!(registry.held.lock().map(|h| h.len()).unwrap_or(1), 0);
    }
}
