//! `augur trial exec` and `augur trial shell`: a command, or an interactive shell, in a
//! running trial's replica, through the server's WebSocket route (`api::exec`).

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;

use super::error::{CliError, CliResult};
use crate::model::{StudyId, TrialId};

/// Where and what to run.
pub struct ExecOptions<'a> {
    pub url: &'a str,
    pub token: Option<&'a str>,
    pub ca_cert: Option<&'a Path>,
    pub study: StudyId,
    pub trial: TrialId,
    pub replica: Option<String>,
    pub command: Vec<String>,
    /// A shell on a terminal (`augur trial shell`) rather than pipes.
    pub tty: bool,
}

/// The streams' tags in the server's binary messages (`api::exec`).
const STDOUT_TAG: u8 = 1;
const STDERR_TAG: u8 = 2;

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// Run the session; the command's exit status (a shell's: 128 + signal when killed).
///
/// `augur trial exec` and `augur trial shell`: a command, or an interactive shell, in a
/// running trial's replica, through the server's WebSocket route (`api::exec`, whose header
/// describes the protocol). `exec` copies this process's stdin to the command and its
/// stdout and stderr back, passes Ctrl-C on as SIGINT, and exits with the command's status;
/// `shell` puts this terminal in raw mode (every key, Ctrl-C included, goes to the remote
/// terminal), follows its size (SIGWINCH), and restores it at the end.
pub async fn run_exec(options: ExecOptions<'_>) -> CliResult<i32> {
    let socket = connect(&options).await?;
    let (mut sink, mut stream) = socket.split();
    let (rows, cols) = terminal_size().unwrap_or((24, 80));
    let start = json!({
        "command": options.command,
        "tty": options.tty,
        "rows": rows,
        "cols": cols,
        "replica": options.replica,
    });
    sink.send(Message::text(start.to_string()))
        .await
        .map_err(lost)?;
    // Raw mode while the session runs (restored when dropped, on every path out).
    let _raw = if options.tty { RawMode::enter() } else { None };
    // Input goes from a task of its own: output must be read while the server waits for
    // the command to take its stdin.
    let sender = tokio::spawn(send_input(sink, options.tty));
    let ended = read_output(&mut stream).await;
    sender.abort();
    ended
}

/// Print the session's output until its exit status (or its error).
async fn read_output(
    stream: &mut (
             impl futures::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin
         ),
) -> CliResult<i32> {
    let closed =
        || CliError::Connection("the server closed the session before the command's exit".into());
    loop {
        let message = match stream.next().await {
            Some(Ok(message)) => message,
            Some(Err(e)) => return Err(lost(e)),
            None => return Err(closed()),
        };
        match message {
            Message::Binary(data) => {
                let (tag, bytes) = data.split_first().map_or((0, &[][..]), |(t, b)| (*t, b));
                if tag == STDERR_TAG {
                    let mut err = std::io::stderr().lock();
                    let _ = err.write_all(bytes);
                    let _ = err.flush();
                } else if tag == STDOUT_TAG {
                    let mut out = std::io::stdout().lock();
                    let _ = out.write_all(bytes);
                    let _ = out.flush();
                }
            }
            Message::Text(text) => {
                let value: Value = serde_json::from_str(text.as_str()).unwrap_or_default();
                match value["type"].as_str() {
                    Some("exit") => return Ok(value["code"].as_i64().map_or(255, |c| c as i32)),
                    Some("error") => return Err(api_error(&value)),
                    _ => {}
                }
            }
            Message::Close(_) => return Err(closed()),
            _ => {}
        }
    }
}

/// Send this process's stdin (its end as `eof` without a terminal), Ctrl-C as SIGINT
/// (without a terminal: in raw mode it is a key like any other) and the terminal's resizes.
/// Ends when the connection does.
async fn send_input(
    mut sink: impl futures::Sink<Message, Error = tokio_tungstenite::tungstenite::Error> + Unpin,
    tty: bool,
) {
    let mut stdin = read_stdin();
    let mut resized = window_changes(tty);
    let mut stdin_open = true;
    loop {
        let message = tokio::select! {
            chunk = stdin.recv(), if stdin_open => match chunk {
                Some(bytes) => Message::binary(bytes),
                None => {
                    stdin_open = false;
                    if tty {
                        continue;
                    }
                    Message::text(json!({"type": "eof"}).to_string())
                }
            },
            _ = tokio::signal::ctrl_c(), if !tty => {
                Message::text(json!({"type": "signal", "signal": "INT"}).to_string())
            }
            Some(()) = resized.recv() => {
                let Some((rows, cols)) = terminal_size() else {
                    continue;
                };
                Message::text(json!({"type": "resize", "rows": rows, "cols": cols}).to_string())
            }
            // Nothing more to send (a terminal session whose stdin ended).
            else => return,
        };
        if sink.send(message).await.is_err() {
            return;
        }
    }
}

fn lost(e: impl std::fmt::Display) -> CliError {
    CliError::Connection(format!("the session's connection failed: {e}"))
}

/// The server's `{"status", "error": {code, message, field}}` as the CLI's API error.
fn api_error(value: &Value) -> CliError {
    let error = if value.get("error").is_some() {
        &value["error"]
    } else {
        value
    };
    CliError::Api {
        status: value["status"].as_u64().map_or(0, |s| s as u16),
        code: error["code"].as_str().unwrap_or("unknown").to_string(),
        message: error["message"]
            .as_str()
            .unwrap_or("the server refused the session")
            .to_string(),
        field: error["field"].as_str().map(str::to_string),
    }
}

/// The WebSocket to the trial's exec route, over TLS for an https server (trusting
/// `ca_cert` besides the system's roots).
async fn connect(
    options: &ExecOptions<'_>,
) -> CliResult<tokio_tungstenite::WebSocketStream<Box<dyn Io>>> {
    let base = url::Url::parse(options.url.trim_end_matches('/'))
        .map_err(|e| CliError::Usage(format!("invalid --url {:?}: {e}", options.url)))?;
    let tls = match base.scheme() {
        "http" => false,
        "https" => true,
        other => {
            return Err(CliError::Usage(format!(
                "--url: {other}: is not http or https"
            )));
        }
    };
    let host = base
        .host_str()
        .ok_or_else(|| CliError::Usage(format!("--url {:?} names no host", options.url)))?
        .to_string();
    let port = base.port_or_known_default().unwrap_or(80);
    let mut ws_url = base.clone();
    let _ = ws_url.set_scheme(if tls { "wss" } else { "ws" });
    let path = format!(
        "{}/v1/studies/{}/trials/{}/exec",
        base.path().trim_end_matches('/'),
        options.study,
        options.trial
    );
    ws_url.set_path(&path);
    let mut request = ws_url
        .as_str()
        .into_client_request()
        .map_err(|e| CliError::Usage(format!("--url: {e}")))?;
    if let Some(token) = options.token {
        let value = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| CliError::Usage("the token is not a valid header value".into()))?;
        request.headers_mut().insert("authorization", value);
    }
    let tcp = tokio::net::TcpStream::connect((host.trim_matches(['[', ']']), port))
        .await
        .map_err(|e| CliError::Connection(format!("cannot reach {}: {e}", options.url)))?;
    let io: Box<dyn Io> = if tls {
        Box::new(tls_connect(tcp, &host, options.ca_cert).await?)
    } else {
        Box::new(tcp)
    };
    match tokio_tungstenite::client_async(request, io).await {
        Ok((socket, _)) => Ok(socket),
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            let status = response.status().as_u16();
            let body: Value = response
                .body()
                .as_deref()
                .and_then(|b| serde_json::from_slice(b).ok())
                .unwrap_or_default();
            let mut value = json!({"status": status});
            value["error"] = body["error"].clone();
            if value["error"].is_null() {
                value["error"] =
                    json!({"code": "unknown", "message": format!("the server answered {status}")});
            }
            Err(api_error(&value))
        }
        Err(e) => Err(CliError::Connection(format!(
            "cannot open a session at {}: {e}",
            options.url
        ))),
    }
}

async fn tls_connect(
    tcp: tokio::net::TcpStream,
    host: &str,
    ca_cert: Option<&Path>,
) -> CliResult<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    use rustls_pki_types::pem::PemObject;
    use tokio_rustls::rustls;
    crate::serve::install_tls_provider();
    let extra: Vec<rustls_pki_types::CertificateDer<'static>> = match ca_cert {
        Some(path) => rustls_pki_types::CertificateDer::pem_file_iter(path)
            .and_then(|certs| certs.collect::<Result<_, _>>())
            .map_err(|e| CliError::file(path, e))?,
        None => Vec::new(),
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier =
        rustls_platform_verifier::Verifier::new_with_extra_roots(extra, provider.clone())
            .map_err(|e| CliError::Connection(format!("TLS: {e}")))?;
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| CliError::Connection(format!("TLS: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    let name = rustls_pki_types::ServerName::try_from(host.trim_matches(['[', ']']).to_string())
        .map_err(|e| CliError::Usage(format!("--url: {host}: {e}")))?;
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| CliError::Connection(format!("TLS with {host}: {e}")))
}

/// This process's stdin, in chunks as they come, from a thread of its own (a blocking read
/// must not hold the runtime up when the session ends); the channel closes at its end.
fn read_stdin() -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel(16);
    std::thread::spawn(move || {
        use std::io::Read;
        let mut stdin = std::io::stdin();
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if tx.blocking_send(buf[..n].to_vec()).is_err() {
                        return;
                    }
                }
            }
        }
    });
    rx
}

/// A message each time this terminal's size changes (never without `tty`).
fn window_changes(tty: bool) -> mpsc::Receiver<()> {
    let (tx, rx) = mpsc::channel(4);
    if tty
        && let Ok(mut signals) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
    {
        tokio::spawn(async move {
            while signals.recv().await.is_some() {
                if tx.send(()).await.is_err() {
                    return;
                }
            }
        });
    }
    rx
}

/// Rows and columns of the terminal on stdout (or stdin), if there is one.
fn terminal_size() -> Option<(u16, u16)> {
    let size = rustix::termios::tcgetwinsize(std::io::stdout())
        .or_else(|_| rustix::termios::tcgetwinsize(std::io::stdin()))
        .ok()?;
    (size.ws_row > 0 && size.ws_col > 0).then_some((size.ws_row, size.ws_col))
}

/// The terminal on stdin in raw mode until dropped: keys go to the remote terminal as they
/// are typed, Ctrl-C and Ctrl-Z included, nothing echoed here.
struct RawMode {
    saved: rustix::termios::Termios,
}

impl RawMode {
    /// `None` when stdin is no terminal (the session still runs, on what stdin gives).
    fn enter() -> Option<RawMode> {
        let stdin = std::io::stdin();
        let saved = rustix::termios::tcgetattr(&stdin).ok()?;
        let mut raw = saved.clone();
        raw.make_raw();
        rustix::termios::tcsetattr(&stdin, rustix::termios::OptionalActions::Now, &raw).ok()?;
        Some(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = rustix::termios::tcsetattr(
            std::io::stdin(),
            rustix::termios::OptionalActions::Now,
            &self.saved,
        );
    }
}
