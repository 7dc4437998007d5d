//! The accept loop (`app.rs` serves through it): HTTP/1.1 over TCP or TLS, with what
//! `axum::serve` lacks against clients that hold connections (issue 10, finding 12):
//! - a request's head must arrive within `header_read_timeout` of its first byte;
//! - a connection on which no byte moves either way for `idle_timeout` is closed (a body
//!   trickled in, an answer never read, a connection no request comes on). Not after the
//!   header-read timeout (hyper's own clock, which runs from the opening or the last
//!   answer): clients keep idle connections for up to 90 s (reqwest, Go), some of them
//!   never used (hyper's pool keeps a connection it opened for a request that another one
//!   then took), and a client that sends on a connection as the server closes it fails a
//!   POST it cannot safely send again (seen under load: `connection closed before message
//!   completed`);
//! - at most `max_connections` are open at once; past that a new one is answered `503` with
//!   `Retry-After` (plain HTTP) or closed (TLS), not queued;
//! - a TLS handshake must finish within `header_read_timeout` too.
//!
//! Shutdown: stop accepting, let open connections finish their requests (graceful), then
//! return.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

/// Refusals (503s past the cap) being written at once; past this, a connection is dropped.
const MAX_REFUSALS: usize = 64;
/// How long open connections may take to finish their requests at shutdown.
const DRAIN: Duration = Duration::from_secs(30);

/// What one client can hold of the server.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
}

/// Serve `router` on `listener` until `stop` resolves.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    tls: Option<TlsAcceptor>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let capacity = limits.max_connections.max(1);
    let slots = Arc::new(Semaphore::new(capacity));
    let refusals = Arc::new(Semaphore::new(MAX_REFUSALS));
    let (stopping, stopped) = watch::channel(false);
    tokio::pin!(stop);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: wait instead of spinning.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            metrics::counter!("augur_connections_refused_total").increment(1);
            if let Ok(permit) = refusals.clone().try_acquire_owned() {
                let plain = tls.is_none();
                tokio::spawn(async move {
                    refuse(stream, plain).await;
                    drop(permit);
                });
            }
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (router, tls, stopped) = (router.clone(), tls.clone(), stopped.clone());
        tokio::spawn(async move {
            match tls {
                None => connection(stream, peer, router, limits, stopped).await,
                Some(acceptor) => {
                    match tokio::time::timeout(limits.header_read_timeout, acceptor.accept(stream))
                        .await
                    {
                        Ok(Ok(stream)) => connection(stream, peer, router, limits, stopped).await,
                        Ok(Err(error)) => tracing::debug!(%error, "TLS handshake failed"),
                        Err(_) => tracing::debug!("TLS handshake timed out"),
                    }
                }
            }
            drop(slot);
        });
    }
    drop(listener);
    // Every connection finishes the request it serves and closes; wait for them all.
    let _ = stopping.send(true);
    let _ = tokio::time::timeout(DRAIN, slots.acquire_many(capacity as u32)).await;
    Ok(())
}

/// One connection: HTTP/1.1 with keep-alive and the head timeout, closed when idle.
async fn connection<I>(
    io: I,
    peer: SocketAddr,
    router: Router,
    limits: ConnectionLimits,
    mut stopped: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (io, last_progress) = Watched::new(io);
    let progress = last_progress.clone();
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let (router, progress) = (router.clone(), progress.clone());
        progress.request_started();
        let mut request = request.map(axum::body::Body::new);
        // Who sent it, for the limit on failed sign-ins (`api::rate_limit::FailureLimit`).
        request
            .extensions_mut()
            .insert(axum::extract::ConnectInfo(peer));
        async move {
            let response = router.oneshot(request).await;
            progress.request_answered();
            Ok::<_, Infallible>(match response {
                Ok(response) => response,
                Err(never) => match never {},
            })
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        // Our own head clock (above), which does not count the wait between requests.
        .header_read_timeout(None)
        .keep_alive(true)
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    tokio::pin!(conn);
    let idle = limits.idle_timeout;
    let mut draining = *stopped.borrow();
    if draining {
        conn.as_mut().graceful_shutdown();
    }
    let head_limit = limits.header_read_timeout;
    loop {
        let since = last_progress.since();
        if since >= idle {
            // No byte either way for that long: a stalled body, an unread answer, or no
            // next request.
            tracing::debug!(?since, "closing an idle connection");
            return;
        }
        let head_for = last_progress.head_for();
        if let Some(head_for) = head_for
            && head_for >= head_limit
        {
            tracing::debug!(?head_for, "closing a connection whose request head is late");
            return;
        }
        // Until the idle or the head deadline, and at most a head's time: a head that
        // begins while this sleeps starts its own clock.
        let wake = (idle - since).min(head_limit - head_for.unwrap_or_default());
        tokio::select! {
            done = conn.as_mut() => {
                if let Err(error) = done {
                    tracing::debug!(%error, "connection ended with an error");
                }
                return;
            }
            changed = stopped.changed(), if !draining => {
                if changed.is_err() || *stopped.borrow() {
                    // Shutting down: finish the request in flight, then close.
                    draining = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
            () = tokio::time::sleep(wake) => {}
        }
    }
}

/// Answer a connection past the cap with `503` and `Retry-After` (only a plain HTTP client
/// can read it), then close it, reading what it sent meanwhile so the close is clean.
async fn refuse(mut stream: TcpStream, plain: bool) {
    if plain {
        let body = r#"{"error":{"code":"unavailable","message":"the server has as many connections as it takes; retry after 1 s","field":null}}"#;
        let answer = format!(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
             retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            stream.write_all(answer.as_bytes()).await?;
            stream.shutdown().await?;
            let mut sink = [0u8; 1024];
            while stream.read(&mut sink).await? > 0 {}
            Ok::<_, std::io::Error>(())
        })
        .await;
    }
}

/// An IO that records when a byte last moved either way, and when the request head being
/// waited for began.
struct Watched<I> {
    inner: I,
    last: Arc<Progress>,
}

/// Milliseconds since `start` when a byte last moved; and the head clock: when the head
/// awaited began (`HEAD_NOT_BEGUN` while the connection waits for a request, `IN_REQUEST`
/// while one is served).
struct Progress {
    start: Instant,
    at_ms: AtomicU64,
    head_since_ms: AtomicU64,
}

const HEAD_NOT_BEGUN: u64 = u64::MAX;
const IN_REQUEST: u64 = u64::MAX - 1;

impl Progress {
    fn now_ms(&self) -> u64 {
        (self.start.elapsed().as_millis() as u64).min(IN_REQUEST - 1)
    }

    fn touch(&self) {
        self.at_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// Bytes came in: if the connection was waiting for a request, a head has begun.
    fn touch_read(&self) {
        let now = self.now_ms();
        self.at_ms.store(now, Ordering::Relaxed);
        let _ = self.head_since_ms.compare_exchange(
            HEAD_NOT_BEGUN,
            now,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// A head arrived: its request is being served.
    fn request_started(&self) {
        self.head_since_ms.store(IN_REQUEST, Ordering::Relaxed);
    }

    /// The request was answered: the connection waits for the next one.
    fn request_answered(&self) {
        self.head_since_ms.store(HEAD_NOT_BEGUN, Ordering::Relaxed);
    }

    fn since(&self) -> Duration {
        let now = self.start.elapsed();
        now.saturating_sub(Duration::from_millis(self.at_ms.load(Ordering::Relaxed)))
    }

    /// How long the head being waited for has taken so far, if one has begun.
    fn head_for(&self) -> Option<Duration> {
        match self.head_since_ms.load(Ordering::Relaxed) {
            HEAD_NOT_BEGUN | IN_REQUEST => None,
            since => Some(
                self.start
                    .elapsed()
                    .saturating_sub(Duration::from_millis(since)),
            ),
        }
    }
}

impl<I> Watched<I> {
    fn new(inner: I) -> (Self, Arc<Progress>) {
        let last = Arc::new(Progress {
            start: Instant::now(),
            at_ms: AtomicU64::new(0),
            head_since_ms: AtomicU64::new(HEAD_NOT_BEGUN),
        });
        (
            Watched {
                inner,
                last: last.clone(),
            },
            last,
        )
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Watched<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.last.touch_read();
        }
        polled
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Watched<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.last.touch();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.last.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Why the server's certificate and key make no TLS acceptor.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("--tls-cert {path}: {source}")]
    Certificate {
        path: String,
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    #[error("--tls-cert {0}: no certificate in it")]
    NoCertificate(String),
    #[error("--tls-key {path}: {source}")]
    Key {
        path: String,
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    #[error("--tls-cert/--tls-key: {0}")]
    Rustls(#[source] tokio_rustls::rustls::Error),
}

/// A TLS acceptor from PEM files: the certificate chain and its private key.
pub fn tls_acceptor(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> Result<TlsAcceptor, TlsError> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    use tokio_rustls::rustls;
    let cert_path = cert.display().to_string();
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<_, _>>())
        .map_err(|source| TlsError::Certificate {
            path: cert_path.clone(),
            source,
        })?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate(cert_path));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|source| TlsError::Key {
        path: key.display().to_string(),
        source,
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Rustls)?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(TlsError::Rustls)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Make ring this process's TLS provider (for reqwest, which asks for the default one):
/// the CLI and worker call it before they build an HTTP client.
pub fn install_tls_provider() {
    let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_counts_from_the_last_byte() {
        let (_, progress) = Watched::new(());
        std::thread::sleep(Duration::from_millis(20));
        assert!(progress.since() >= Duration::from_millis(20));
        progress.touch();
        assert!(progress.since() < Duration::from_millis(20));
    }
}
