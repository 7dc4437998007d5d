//! A userspace TCP relay for faults the kernel here cannot make (no `netem`): it cuts its open
//! connections on demand (`cut`), and delays every byte and drops connections while
//! `set_faults` says so. It runs on the runtime that starts it: on a cluster node's runtime
//! it listens and connects as that node.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A relay's faults, changed while it runs, and what it did.
#[derive(Default)]
pub struct LinkFaults {
    /// Added to each direction of every connection, in milliseconds.
    delay_ms: AtomicU64,
    /// A connection's chance in 1000 to be cut, when it opens and in each second after.
    drop_per_mille: AtomicU64,
    pub connections: AtomicU64,
    pub dropped: AtomicU64,
}

/// A TCP relay to `upstream` whose open connections the test can cut (each side sees its
/// socket closed, with no error message from the server).
pub struct Relay {
    pub port: u16,
    open: Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>>,
    pub faults: Arc<LinkFaults>,
}

impl Relay {
    /// A relay on a free port of 127.0.0.1.
    pub async fn start(upstream: String) -> Relay {
        Self::start_on("127.0.0.1:0".into(), upstream).await
    }

    /// A relay listening on `listen` (`ADDRESS:PORT`, port 0 for a free one).
    pub async fn start_on(listen: String, upstream: String) -> Relay {
        let listener = tokio::net::TcpListener::bind(&listen).await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let open = Arc::new(std::sync::Mutex::new(Vec::<tokio::task::AbortHandle>::new()));
        let faults = Arc::new(LinkFaults::default());
        let (connections, link) = (open.clone(), faults.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (upstream, faults) = (upstream.clone(), link.clone());
                link.connections.fetch_add(1, Ordering::Relaxed);
                let task = tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&upstream).await {
                        let (client_read, client_write) = client.into_split();
                        let (server_read, server_write) = server.into_split();
                        tokio::join!(
                            delayed_copy(client_read, server_write, &faults),
                            delayed_copy(server_read, client_write, &faults)
                        );
                    }
                });
                if link.drops() {
                    // Cut within its first second: maybe before, maybe inside its first request.
                    link.dropped.fetch_add(1, Ordering::Relaxed);
                    let (victim, after) = (task.abort_handle(), rand::random_range(0..1000));
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(after)).await;
                        victim.abort();
                    });
                }
                if let Ok(mut open) = connections.lock() {
                    open.retain(|t| !t.is_finished());
                    open.push(task.abort_handle());
                }
            }
        });
        // Long-lived connections (a server's pool) are dropped too: each, every second, with
        // the same chance as a new one.
        let (connections, link) = (open.clone(), faults.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                if let Ok(open) = connections.lock() {
                    for task in open.iter().filter(|t| !t.is_finished()) {
                        if link.drops() {
                            link.dropped.fetch_add(1, Ordering::Relaxed);
                            task.abort();
                        }
                    }
                }
            }
        });
        Relay { port, open, faults }
    }

    /// Close every connection open now (new ones are still relayed).
    pub fn cut(&self) {
        if let Ok(mut open) = self.open.lock() {
            for task in open.drain(..) {
                task.abort();
            }
        }
    }

    /// From now on, every byte is delayed `delay` each way, and each connection has a chance
    /// of `drop_per_mille` in 1000 to be cut when it opens and in each second it stays open.
    pub fn set_faults(&self, delay: Duration, drop_per_mille: u64) {
        let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.faults.delay_ms.store(delay_ms, Ordering::Relaxed);
        self.faults
            .drop_per_mille
            .store(drop_per_mille, Ordering::Relaxed);
    }
}

impl LinkFaults {
    fn drops(&self) -> bool {
        rand::random_range(0..1000) < self.drop_per_mille.load(Ordering::Relaxed)
    }
}

/// One direction until its reader ends, each chunk written the link's delay after it was read
/// (a queue, so a slow link still carries data at full rate); then the write side is shut.
async fn delayed_copy(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    faults: &LinkFaults,
) {
    let (send, mut receive) = tokio::sync::mpsc::unbounded_channel();
    let reader = async move {
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buf).await {
            let delay = Duration::from_millis(faults.delay_ms.load(Ordering::Relaxed));
            if send
                .send((tokio::time::Instant::now() + delay, buf[..n].to_vec()))
                .is_err()
            {
                break;
            }
        }
    };
    let writer = async move {
        while let Some((due, bytes)) = receive.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer);
}
