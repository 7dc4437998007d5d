//! `GET /v1/studies/{study}/trials/{trial}/exec`: a command or a shell in a running trial's
//! replica, over a WebSocket (`augur trial exec`, `augur trial shell`). Who may, and on which
//! trials, is checked before the upgrade (`Service::exec_target`), so a refusal is an
//! ordinary JSON error; the session itself is opened by the service over the executors.

use axum::extract::ws::{
    Message, WebSocket, WebSocketUpgrade, rejection::WebSocketUpgradeRejection,
};
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use futures::{Sink, SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::json;
use utoipa::ToSchema;

use super::AppState;
use super::access::{Access, AccessRouter};
use super::auth::Actor;
use super::error::{ApiError, ApiResult, ErrorBody};
use super::extract::{STUDY_ID, TRIAL_ID, parse_id};
use crate::model::Role;
use crate::service::exec::{ExecExit, ExecInput, ExecOutput, ExecSignal, ExecTarget};
use crate::service::{Caller, Service};
use utoipa_axum::routes;

pub fn router() -> AccessRouter {
    // A writer's route, as every change of a study: the service lets only the study's
    // creator or an admin in.
    AccessRouter::new().routes(Access::Role(Role::Writer), routes!(exec_trial))
}

/// The route's path template, as the auth layer matches it: only here may a WebSocket carry
/// its token as a subprotocol (`auth::BEARER_SUBPROTOCOL`).
pub const ROUTE: &str = "/v1/studies/{study}/trials/{trial}/exec";

/// The subprotocol the server selects when the client offers it (a browser's WebSocket must
/// offer one to carry its token in another, and fails unless the server selects one).
pub const SUBPROTOCOL: &str = "augur.exec";

/// Stream tags of the server's binary messages.
pub const STDOUT_TAG: u8 = 1;
pub const STDERR_TAG: u8 = 2;

/// The largest message a client may send (stdin is sent in pieces).
const MAX_CLIENT_MESSAGE: usize = 1 << 20;

/// The first message of a session: what to run, and where.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecStart {
    /// Program and arguments, not passed through a shell (name one to get one: `["bash"]`).
    pub command: Vec<String>,
    /// Run it on a new pseudo-terminal (a shell); otherwise on pipes, stdout and stderr
    /// apart.
    #[serde(default)]
    pub tty: bool,
    /// The terminal's size (with `tty`; 24 × 80 by default).
    pub rows: Option<u16>,
    pub cols: Option<u16>,
    /// The replica of a cluster trial, e.g. `workerpool1-0`; the primary when absent.
    pub replica: Option<String>,
}

/// A client's control message during a session.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ExecControl {
    /// The terminal's new size.
    Resize { rows: u16, cols: u16 },
    /// A signal to the command's process group: INT, TERM, KILL, HUP or QUIT.
    Signal { signal: String },
    /// No more stdin.
    Eof,
}

/// Run a command or a shell in a running trial's replica, over a WebSocket.
///
/// The study's creator or an admin, on a running trial that this server's dispatcher runs;
/// each session is in the audit trail. After the upgrade the client sends an `ExecStart`
/// (a text message), then its stdin as binary messages and `ExecControl`s as text messages
/// (resize, signal, eof). The server sends the output as binary messages whose first byte
/// is the stream (1 stdout, 2 stderr; a terminal has only 1), then
/// `{"type": "exit", "code": N, "signal": S or null}` (`code` as a shell reports it), or
/// `{"type": "error", "status", "error": {code, message, field}}` if the session could not
/// start, and closes. A client that goes away ends the session and kills its command.
///
/// The token goes in `Authorization: Bearer <token>`. A browser cannot set that header on a
/// WebSocket, so a client may instead offer the subprotocols `augur.exec` and
/// `base64url.bearer.augur.<token in base64url, without padding>` (as Kubernetes' API server
/// takes one): the token is checked as a bearer token (same roles, same audit), a malformed
/// one is 401, and the server selects `augur.exec`, never echoing the token. The dashboard's
/// cookie never authorizes a session, and an upgrade from a page of another origin is 403.
#[utoipa::path(get, path = "/v1/studies/{study}/trials/{trial}/exec", tag = "trials",
    params(("study" = String, Path, description = STUDY_ID), ("trial" = String, Path, description = TRIAL_ID)),
    responses(
        (status = 101, description = "Switching to the WebSocket session; its first message is an ExecStart"),
        (status = 400, description = "Not a WebSocket upgrade request", body = ErrorBody),
        (status = 401, description = "No valid bearer token (in Authorization, or the subprotocol `base64url.bearer.augur.<token>`)", body = ErrorBody),
        (status = 403, description = "Neither the study's creator nor an admin, or a page of another origin", body = ErrorBody),
        (status = 404, description = "No such study or trial", body = ErrorBody),
        (status = 409, description = "The trial is not running (`state`), or not run by this server's dispatcher (`trial`: a pulled or ask/tell trial)", body = ErrorBody),
    ))]
///
/// The protocol, after the upgrade:
/// - the client's first message is a text message, [`ExecStart`]: the command, `tty`, the
///   terminal's `rows` and `cols`, the `replica` (the primary by default);
/// - then binary messages are the command's stdin; text messages are controls
///   ([`ExecControl`]): `{"type": "resize", "rows", "cols"}`, `{"type": "signal",
///   "signal": "INT"}` (also TERM, KILL, HUP, QUIT), `{"type": "eof"}` (closes stdin);
/// - the server sends binary messages whose first byte says the stream (1 stdout, 2 stderr;
///   a terminal has only 1) and whose rest is its bytes, then one text message
///   `{"type": "exit", "code": N, "signal": S or null}` (`code` as a shell reports it, 128 +
///   the signal for a killed command), or `{"type": "error", "status", "error": {code,
///   message, field}}` when the session could not start; then it closes.
///
/// A client that goes away ends the session: its command's process group is killed.
pub async fn exec_trial(
    State(state): State<AppState>,
    Actor(actor): Actor,
    Path((study, trial)): Path<(String, String)>,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> ApiResult<Response> {
    let (study, trial) = (parse_id(&study, "study")?, parse_id(&trial, "trial")?);
    let target = state.service.exec_target(&actor, study, trial).await?;
    let upgrade = upgrade.map_err(|e| ApiError::InvalidArgument {
        message: format!("a session is a WebSocket: {e}"),
        field: None,
    })?;
    let service = state.service.clone();
    Ok(upgrade
        .protocols([SUBPROTOCOL])
        .max_message_size(MAX_CLIENT_MESSAGE)
        .on_upgrade(move |socket| run_session(socket, service, actor, target))
        .into_response())
}

/// Carry one session from its first message to its exit.
async fn run_session(mut socket: WebSocket, service: Service, actor: Caller, target: ExecTarget) {
    let start =
        match socket.recv().await {
            Some(Ok(Message::Text(text))) => serde_json::from_str::<ExecStart>(text.as_str())
                .map_err(|e| ApiError::InvalidArgument {
                    message: format!("the first message is not an ExecStart: {e}"),
                    field: None,
                }),
            Some(Ok(_)) => Err(ApiError::InvalidArgument {
                message: "the first message must be a text message: a JSON ExecStart".into(),
                field: None,
            }),
            _ => return,
        };
    let start = match start {
        Ok(start) => start,
        Err(e) => return send_error(&mut socket, e).await,
    };
    let size = match (start.rows, start.cols) {
        (None, None) => None,
        (rows, cols) => Some((rows.unwrap_or(24), cols.unwrap_or(80))),
    };
    let opened = service
        .open_exec(
            &actor,
            &target,
            start.command,
            start.tty,
            size,
            start.replica.as_deref(),
        )
        .await;
    let session = match opened {
        Ok(session) => session,
        Err(e) => return send_error(&mut socket, e.into()).await,
    };
    let (mut sink, stream) = socket.split();
    // The client's messages go to the command from a task of their own: a command that
    // does not read its stdin while its output waits to be sent must not stop the output.
    let (refused_tx, mut refused) = tokio::sync::mpsc::channel::<ApiError>(1);
    let reader = tokio::spawn(carry_input(stream, session.input, refused_tx));
    let mut output = session.output;
    loop {
        tokio::select! {
            out = output.recv() => match out {
                Some(ExecOutput::Stdout(bytes)) => {
                    if send_tagged(&mut sink, STDOUT_TAG, bytes).await.is_err() {
                        break;
                    }
                }
                Some(ExecOutput::Stderr(bytes)) => {
                    if send_tagged(&mut sink, STDERR_TAG, bytes).await.is_err() {
                        break;
                    }
                }
                Some(ExecOutput::Exit(exit)) => {
                    let (code, signal) = match exit {
                        ExecExit::Exited(_) => (exit.status(), None),
                        ExecExit::Signaled(s) => (exit.status(), Some(s)),
                    };
                    let message = json!({"type": "exit", "code": code, "signal": signal});
                    let _ = sink.send(Message::text(message.to_string())).await;
                    let _ = sink.send(Message::Close(None)).await;
                    break;
                }
                None => break,
            },
            Some(error) = refused.recv() => {
                send_error(&mut sink, error).await;
                break;
            }
        }
    }
    // Gone, or refused: the session's input closes, which ends its command.
    reader.abort();
}

/// The client's messages as the session's input, until it goes (closes, or its connection
/// breaks: dropping `input` then ends the command) or sends a message that is no control
/// (told through `refused`).
async fn carry_input(
    mut stream: futures::stream::SplitStream<WebSocket>,
    input: tokio::sync::mpsc::Sender<ExecInput>,
    refused: tokio::sync::mpsc::Sender<ApiError>,
) {
    while let Some(message) = stream.next().await {
        let next = match message {
            Ok(Message::Binary(bytes)) => ExecInput::Stdin(bytes.to_vec()),
            Ok(Message::Text(text)) => match control(text.as_str()) {
                Ok(input) => input,
                Err(e) => {
                    let _ = refused.send(e).await;
                    return;
                }
            },
            Ok(Message::Ping(_) | Message::Pong(_)) => continue,
            Ok(Message::Close(_)) | Err(_) => return,
        };
        if input.send(next).await.is_err() {
            return;
        }
    }
}

/// A control message as the session's input.
fn control(text: &str) -> Result<ExecInput, ApiError> {
    let control: ExecControl =
        serde_json::from_str(text).map_err(|e| ApiError::InvalidArgument {
            message: format!("not a control message: {e}"),
            field: Some("type".into()),
        })?;
    Ok(match control {
        ExecControl::Resize { rows, cols } if rows > 0 && cols > 0 => {
            ExecInput::Resize { rows, cols }
        }
        ExecControl::Resize { .. } => {
            return Err(ApiError::invalid("rows", "rows and cols must be positive"));
        }
        ExecControl::Signal { signal } => ExecInput::Signal(
            ExecSignal::parse(&signal)
                .ok_or_else(|| ApiError::invalid("signal", "one of INT, TERM, KILL, HUP, QUIT"))?,
        ),
        ExecControl::Eof => ExecInput::Eof,
    })
}

async fn send_tagged(
    socket: &mut (impl Sink<Message, Error = axum::Error> + Unpin),
    tag: u8,
    bytes: Vec<u8>,
) -> Result<(), axum::Error> {
    let mut data = Vec::with_capacity(bytes.len() + 1);
    data.push(tag);
    data.extend_from_slice(&bytes);
    socket.send(Message::binary(data)).await
}

/// Tell the client why the session ended before its command did (as the API renders
/// errors, with the status it would have had), and close.
async fn send_error(
    socket: &mut (impl Sink<Message, Error = axum::Error> + Unpin),
    error: ApiError,
) {
    let response = error.into_response();
    let status = response.status().as_u16();
    let body = axum::body::to_bytes(response.into_body(), 64 * 1024)
        .await
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .map(|v| v["error"].clone())
        .unwrap_or_default();
    let message = json!({"type": "error", "status": status, "error": body});
    let _ = socket.send(Message::text(message.to_string())).await;
    let _ = socket.send(Message::Close(None)).await;
}
