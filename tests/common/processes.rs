//! Real child processes: `augur serve` as a `ServerProcess`, any child killed on drop
//! (`KillOnDrop`), free ports, and what /proc says about processes and their groups.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::client::http;

/// The `augur` binary that cargo built for these tests.
pub fn augur_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_augur"))
}

/// A real `augur serve` process; killed when dropped.
pub struct ServerProcess {
    pub child: Child,
    pub base: String,
}

impl ServerProcess {
    pub fn start(database_url: &str, port: u16) -> ServerProcess {
        Self::start_with(database_url, port, &[])
    }

    /// The full URL of `path` on this server.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// `augur serve` with more arguments (`--no-dispatch`, …).
    pub fn start_with(database_url: &str, port: u16, more: &[&str]) -> ServerProcess {
        let child = Command::new(augur_bin())
            .args([
                "serve",
                "--database-url",
                database_url,
                "--listen",
                &format!("127.0.0.1:{port}"),
            ])
            .args(more)
            .env("AUGUR_LOG", "warn")
            .env_remove("AUGUR_TOKEN")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn augur serve");
        ServerProcess {
            child,
            base: format!("http://127.0.0.1:{port}"),
        }
    }

    /// Wait until `/readyz` answers 200.
    pub async fn wait_ready(&self) {
        let http = http();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(r) = http.get(format!("{}/readyz", self.base)).send().await
                && r.status().is_success()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("augur serve at {} did not become ready", self.base);
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A child process that is killed and reaped when dropped, so that a test that panics
/// leaves nothing running: a leftover process holding the test's inherited stderr would
/// also keep `cargo test | tee` (the test command) waiting for it.
pub struct KillOnDrop(pub Child);

impl KillOnDrop {
    /// Wait for the process to end, on a blocking thread.
    pub async fn wait(mut self) -> std::process::ExitStatus {
        tokio::task::spawn_blocking(move || self.0.wait())
            .await
            .expect("join")
            .expect("wait")
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // Both fail harmlessly once the process has been waited for.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A free loopback port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// Every process id in /proc.
pub fn pids() -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// A process's state letter and process group, from `/proc/PID/stat` ("pid (comm) state
/// ppid pgrp …", where comm may hold spaces and parentheses); `None` once it is gone.
pub fn proc_stat(pid: i32) -> Option<(char, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some((
        fields.first()?.chars().next()?,
        fields.get(2)?.parse().ok()?,
    ))
}

/// Whether the process exists and is not a zombie (dead for a test's purposes).
pub fn alive(pid: i32) -> bool {
    proc_stat(pid).is_some_and(|(state, _)| state != 'Z')
}

/// Live processes whose process group is `pgid`, or whose pid is `pgid`.
pub fn alive_in_group(pgid: i32) -> Vec<i32> {
    pids()
        .into_iter()
        .filter(|&pid| {
            proc_stat(pid)
                .is_some_and(|(state, group)| state != 'Z' && (pid == pgid || group == pgid))
        })
        .collect()
}

/// Trial jobs alive whose command line mentions `marker`, counted by process group: each
/// job runs in its own group, and `python3` may be a shim that briefly forks helpers.
pub fn processes_with(marker: &str) -> usize {
    let groups: std::collections::BTreeSet<i32> = pids()
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(marker))
                .unwrap_or(false)
        })
        .filter_map(|pid| proc_stat(pid).filter(|(state, _)| *state != 'Z'))
        .map(|(_, group)| group)
        .collect();
    groups.len()
}
