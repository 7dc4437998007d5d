//! Several hosts on this machine (`scripts/test-cluster.sh`): `TestCluster` makes the nodes
//! (one cluster at a time on the machine: a file lock) and removes them when dropped;
//! `NodeRuntime` is a tokio runtime whose threads live on a node, for clients and relays in
//! this process; `NodePostgres` is a PostgreSQL of its own running on a node.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The nodes of `scripts/test-cluster.sh up N`, removed (with whatever runs on them) on drop.
pub struct TestCluster {
    /// The script's state directory: its hosts file, and the tests' logs and data.
    pub dir: PathBuf,
    _lock: nix::fcntl::Flock<File>,
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/test-cluster.sh")
}

impl TestCluster {
    /// `up nodes`, once no other test (in this process or another) holds a cluster: they
    /// would share the bridge and the node names.
    pub fn up(nodes: usize) -> TestCluster {
        let lock_file = File::create("/run/lock/augur-test-cluster.lock")
            .or_else(|_| File::create("/tmp/augur-test-cluster.lock"))
            .expect("the cluster's lock file");
        let lock = nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| e)
            .expect("the cluster's lock");
        let cluster = TestCluster {
            dir: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/test-cluster"),
            _lock: lock,
        };
        cluster.script(&["up", &nodes.to_string()]);
        std::fs::create_dir_all(cluster.dir.join("logs")).expect("logs directory");
        cluster
    }

    fn script(&self, args: &[&str]) -> String {
        let out = Command::new(script())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("scripts/test-cluster.sh");
        assert!(
            out.status.success(),
            "test-cluster.sh {args:?} (needs root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// The node's address on the bridge.
    pub fn addr(&self, node: &str) -> String {
        self.script(&["addr", node])
    }

    /// `program` run on `node`, as that host (the child is `program` itself).
    pub fn command(&self, node: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new(script());
        command.args(["exec", node, "--"]).arg(program);
        command
    }

    /// Drop every packet between the two nodes, both ways.
    pub fn cut(&self, a: &str, b: &str) {
        self.script(&["cut", a, b]);
    }

    pub fn heal(&self, a: &str, b: &str) {
        self.script(&["heal", a, b]);
    }

    /// Every process on `node` SIGKILLed at once, as when the machine loses power: its
    /// slurmd, the steps it ran and their tasks. Its address stays (nothing answers there).
    pub fn kill_node(&self, node: &str) {
        let pids = Command::new("ip")
            .args(["netns", "pids", node])
            .output()
            .expect("ip netns pids");
        for pid in String::from_utf8_lossy(&pids.stdout).split_whitespace() {
            if let Ok(pid) = pid.parse::<i32>() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }

    /// The processes on `node` whose command line contains `text`.
    pub fn processes_on(&self, node: &str, text: &str) -> Vec<i32> {
        let pids = Command::new("ip")
            .args(["netns", "pids", node])
            .output()
            .expect("ip netns pids");
        String::from_utf8_lossy(&pids.stdout)
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
            .filter(|p| {
                std::fs::read(format!("/proc/{p}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains(text))
            })
            .collect()
    }

    /// slurmctld on `controller` and a slurmd on each of `nodes`, every node idle: the
    /// `slurm.conf` to give as `SLURM_CONF`.
    pub fn slurm(&self, controller: &str, nodes: &[&str]) -> PathBuf {
        let mut args = vec!["slurm", controller];
        args.extend_from_slice(nodes);
        PathBuf::from(self.script(&args))
    }

    /// A log file for what runs on the cluster (kept after the test, for a failure's reader).
    pub fn log(&self, name: &str) -> File {
        File::create(self.dir.join("logs").join(name)).expect("log file")
    }

    /// A runtime whose every thread (workers and blocking) is on `node`'s network: sockets
    /// that its tasks open are that host's.
    pub fn runtime(&self, node: &str, threads: usize) -> NodeRuntime {
        let netns = std::sync::Arc::new(
            File::open(format!("/var/run/netns/{node}")).expect("the node's network namespace"),
        );
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .on_thread_start(move || {
                nix::sched::setns(&*netns, nix::sched::CloneFlags::CLONE_NEWNET)
                    .expect("enter the node's network namespace");
            })
            .build()
            .expect("the node's runtime");
        NodeRuntime {
            runtime: Some(runtime),
        }
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        let _ = Command::new(script())
            .arg("down")
            .stdin(Stdio::null())
            .status();
    }
}

/// A tokio runtime on a node (see [`TestCluster::runtime`]); its tasks stop when it is dropped.
pub struct NodeRuntime {
    runtime: Option<tokio::runtime::Runtime>,
}

impl NodeRuntime {
    /// Run `task` on the node; await the result from any runtime.
    pub fn spawn<F>(&self, task: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.runtime.as_ref().expect("running").spawn(task)
    }

    /// Run `task` on the node and wait for it.
    pub async fn run<F>(&self, task: F) -> F::Output
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.spawn(task).await.expect("the node's task")
    }
}

impl Drop for NodeRuntime {
    fn drop(&mut self) {
        // Dropped inside the test's runtime: a blocking shutdown would panic there.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// A PostgreSQL cluster of its own on a node (data under the cluster's directory, trusting
/// the bridge's subnet), stopped when dropped.
pub struct NodePostgres {
    child: Option<Child>,
    /// `postgres://postgres@ADDRESS:PORT/postgres`, reachable from every node.
    pub url: String,
}

const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

impl NodePostgres {
    pub fn start(cluster: &TestCluster, node: &str, port: u16) -> NodePostgres {
        let addr = cluster.addr(node);
        let dir = cluster.dir.join(format!("pg-{node}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("PostgreSQL's directory");
        let data = dir.join("data");
        let as_postgres = |program: &str| {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--", &format!("{PG_BIN}/{program}")]);
            command
        };
        let owned = Command::new("chown")
            .args(["postgres:postgres"])
            .arg(&dir)
            .status()
            .expect("chown");
        assert!(owned.success(), "chown PostgreSQL's directory to postgres");
        let out = as_postgres("initdb")
            .args(["-A", "trust", "-U", "postgres", "-N", "-D"])
            .arg(&data)
            .output()
            .expect("initdb");
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let subnet = addr.rsplit_once('.').map_or(addr.as_str(), |(net, _)| net);
        let hba = data.join("pg_hba.conf");
        let mut rules = std::fs::read_to_string(&hba).expect("pg_hba.conf");
        rules.push_str(&format!("host all all {subnet}.0/24 trust\n"));
        std::fs::write(&hba, rules).expect("pg_hba.conf");
        // setpriv, not runuser: it execs, so the child is the postmaster itself.
        let child = cluster
            .command(node, "setpriv")
            .args(["--reuid=postgres", "--regid=postgres", "--init-groups"])
            .arg(format!("{PG_BIN}/postgres"))
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string(), "-k"])
            .arg(&dir)
            .args(["-c", &format!("listen_addresses={addr}")])
            .args(["-c", "fsync=off", "-c", "max_connections=200"])
            .stdin(Stdio::null())
            .stdout(cluster.log(&format!("{node}-postgres.log")))
            .stderr(cluster.log(&format!("{node}-postgres.err")))
            .spawn()
            .expect("postgres");
        let pg = NodePostgres {
            child: Some(child),
            url: format!("postgres://postgres@{addr}:{port}/postgres"),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = cluster
                .command(node, "pg_isready")
                .args(["-q", "-h", &addr, "-p", &port.to_string()])
                .status()
                .expect("pg_isready");
            if ready.success() {
                return pg;
            }
            assert!(Instant::now() < deadline, "PostgreSQL on {node} not ready");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for NodePostgres {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // SIGQUIT: immediate shutdown, the postmaster takes its backends with it.
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGQUIT);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}
