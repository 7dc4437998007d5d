//! Exec and shell sessions in a running attempt's replica (`service::exec`), each a local
//! process: the command itself or the tool that carries it there ([`spawn_session`]).

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;

use async_trait::async_trait;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use super::executor::{ExecutorContext, executor_for};
use super::handle::JobHandle;
use crate::service::exec::{
    ExecExit, ExecInput, ExecOutput, ExecRefused, ExecRequest, ExecSession, ExecSignal, ExecTarget,
    TrialExec,
};

/// The local process that runs a session's command: the command itself (local replicas), or
/// the tool that runs it in the replica (`podman exec`, `srun`).
#[derive(Debug, Clone, Default)]
pub struct SessionProcess {
    pub argv: Vec<String>,
    /// Its whole environment (`None`: the server's own, for a tool such as `podman`).
    pub env: Option<Vec<(OsString, OsString)>>,
    pub workdir: Option<PathBuf>,
    /// Run as this uid and gid rather than the server's.
    pub user: Option<(u32, u32)>,
}

/// How an executor reaches a replica: a local process to start (the command itself, or a
/// tool that carries it there), or a session it opened itself (an API's stream).
pub enum ExecVia {
    Process(SessionProcess),
    Session(ExecSession),
}

/// Opens sessions through the executor each trial's study names.
///
/// Exec and shell sessions in a running attempt's replica (`service::exec`): each executor
/// says how a command reaches the replica ([`Executor::exec`]: the replica's process
/// environment on this machine, `podman exec`, `srun --overlap`), and every one of them then
/// runs a local process, the command itself or the tool that carries it there, on pipes or
/// on a new pseudo-terminal ([`spawn_session`]).
///
/// [`Executor::exec`]: super::executor::Executor::exec
pub struct DispatchExec {
    context: ExecutorContext,
}

impl DispatchExec {
    pub fn new(context: ExecutorContext) -> Arc<Self> {
        Arc::new(Self { context })
    }
}

#[async_trait]
impl TrialExec for DispatchExec {
    async fn open(
        &self,
        target: &ExecTarget,
        request: &ExecRequest,
    ) -> Result<ExecSession, ExecRefused> {
        let handle: JobHandle = target.handle.parse().map_err(|e| refused(format!("{e}")))?;
        let executor =
            executor_for(&target.job, &self.context).map_err(|e| refused(e.to_string()))?;
        match executor.exec(&handle, target, request).await? {
            ExecVia::Session(session) => Ok(session),
            ExecVia::Process(process) => spawn_session(process, request)
                .map_err(|e| refused(format!("cannot start {:?}: {e}", process_name(request)))),
        }
    }
}

fn process_name(request: &ExecRequest) -> String {
    request.command.first().cloned().unwrap_or_default()
}

/// A refusal about the running job (no field: the request itself was fine).
pub fn refused(message: impl Into<String>) -> ExecRefused {
    ExecRefused {
        message: message.into(),
        field: None,
    }
}

/// A refusal about the replica the request named.
pub fn refused_replica(message: impl Into<String>) -> ExecRefused {
    ExecRefused {
        message: message.into(),
        field: Some("replica".into()),
    }
}

/// Start `process` on pipes, or on a new pseudo-terminal of the requested size (its own
/// session, the terminal its controlling one, so Ctrl-C typed into it interrupts the
/// foreground job). Its process group is killed when the session's input is dropped.
pub fn spawn_session(
    process: SessionProcess,
    request: &ExecRequest,
) -> std::io::Result<ExecSession> {
    let (program, args) = process
        .argv
        .split_first()
        .ok_or_else(|| std::io::Error::other("empty command"))?;
    let (input_tx, input_rx) = mpsc::channel::<ExecInput>(64);
    let (output_tx, output_rx) = mpsc::channel::<ExecOutput>(64);
    if request.tty {
        let (pty, pts) = pty_process::open().map_err(std::io::Error::other)?;
        pty.resize(pty_process::Size::new(request.rows, request.cols))
            .map_err(std::io::Error::other)?;
        let mut command = pty_process::Command::new(program).args(args);
        if let Some(env) = process.env {
            command = command.env_clear().envs(env);
        }
        if let Some(dir) = &process.workdir {
            command = command.current_dir(dir);
        }
        if let Some((uid, gid)) = process.user {
            command = command.uid(uid).gid(gid);
        }
        let child = command
            .kill_on_drop(true)
            .spawn(pts)
            .map_err(std::io::Error::other)?;
        let group = child.id().map_or(0, |id| id as i32);
        let (reader, writer) = pty.into_split();
        tokio::spawn(run_session(
            child,
            group,
            Some(Box::new(reader)),
            None,
            Box::new(TtyInput(writer)),
            input_rx,
            output_tx,
        ));
    } else {
        let mut command = tokio::process::Command::new(program);
        command
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        if let Some(env) = process.env {
            command.env_clear().envs(env);
        }
        if let Some(dir) = &process.workdir {
            command.current_dir(dir);
        }
        if let Some((uid, gid)) = process.user {
            command.uid(uid).gid(gid);
        }
        let mut child = command.spawn()?;
        let group = child.id().map_or(0, |id| id as i32);
        let stdout = child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn AsyncRead + Send + Unpin>);
        let stderr = child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn AsyncRead + Send + Unpin>);
        let stdin: Box<dyn SessionInput> = match child.stdin.take() {
            Some(stdin) => Box::new(PipeInput(Some(stdin))),
            None => Box::new(PipeInput(None)),
        };
        tokio::spawn(run_session(
            child, group, stdout, stderr, stdin, input_rx, output_tx,
        ));
    }
    Ok(ExecSession {
        input: input_tx,
        output: output_rx,
    })
}

/// Where a session's input goes: a pipe, or the terminal (which also resizes).
#[async_trait]
trait SessionInput: Send {
    async fn write(&mut self, bytes: &[u8]) -> std::io::Result<()>;
    fn close(&mut self);
    fn resize(&mut self, rows: u16, cols: u16);
}

struct PipeInput(Option<tokio::process::ChildStdin>);

#[async_trait]
impl SessionInput for PipeInput {
    async fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match &mut self.0 {
            Some(stdin) => {
                stdin.write_all(bytes).await?;
                stdin.flush().await
            }
            None => Ok(()),
        }
    }

    fn close(&mut self) {
        self.0 = None;
    }

    fn resize(&mut self, _rows: u16, _cols: u16) {}
}

struct TtyInput(pty_process::OwnedWritePty);

#[async_trait]
impl SessionInput for TtyInput {
    async fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        write_all(&mut self.0, bytes).await
    }

    /// A terminal has no end of input but the one its user types (Ctrl-D).
    fn close(&mut self) {}

    fn resize(&mut self, rows: u16, cols: u16) {
        let _ = self.0.resize(pty_process::Size::new(rows, cols));
    }
}

async fn write_all(to: &mut (impl AsyncWrite + Unpin), bytes: &[u8]) -> std::io::Result<()> {
    to.write_all(bytes).await?;
    to.flush().await
}

/// Read `from` into `tx` as `wrap`ped chunks until its end (a PTY ends with EIO once the
/// last process holding it is gone).
pub(super) async fn forward(
    mut from: Box<dyn AsyncRead + Send + Unpin>,
    tx: mpsc::Sender<ExecOutput>,
    wrap: fn(Vec<u8>) -> ExecOutput,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if tx.send(wrap(buf[..n].to_vec())).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Carry a session: input to the process, its output back, its exit last. The process
/// group is killed when the client goes (its input channel closes) and once the command
/// has exited (nothing it started outlives the session).
async fn run_session(
    mut child: tokio::process::Child,
    group: i32,
    stdout: Option<Box<dyn AsyncRead + Send + Unpin>>,
    stderr: Option<Box<dyn AsyncRead + Send + Unpin>>,
    mut stdin: Box<dyn SessionInput>,
    mut input: mpsc::Receiver<ExecInput>,
    output: mpsc::Sender<ExecOutput>,
) {
    let mut readers = tokio::task::JoinSet::new();
    if let Some(out) = stdout {
        readers.spawn(forward(out, output.clone(), ExecOutput::Stdout));
    }
    if let Some(err) = stderr {
        readers.spawn(forward(err, output.clone(), ExecOutput::Stderr));
    }
    let signal_group = |signal: Signal| {
        if group > 0 {
            let _ = killpg(Pid::from_raw(group), signal);
        }
    };
    let mut client_gone = false;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            message = input.recv(), if !client_gone => match message {
                Some(ExecInput::Stdin(bytes)) => {
                    if stdin.write(&bytes).await.is_err() {
                        stdin.close();
                    }
                }
                Some(ExecInput::Eof) => stdin.close(),
                Some(ExecInput::Resize { rows, cols }) => stdin.resize(rows, cols),
                Some(ExecInput::Signal(signal)) => signal_group(nix_signal(signal)),
                None => {
                    // The client went away: so does its command.
                    client_gone = true;
                    signal_group(Signal::SIGHUP);
                    signal_group(Signal::SIGKILL);
                }
            },
        }
    };
    // What the command started in its group goes with it; the output it already wrote is
    // still read to its end (a PTY's reader ends once no process holds the terminal).
    signal_group(Signal::SIGKILL);
    drop(stdin);
    let drained = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        while readers.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        readers.abort_all();
    }
    let _ = output.send(ExecOutput::Exit(exit_of(status))).await;
}

fn exit_of(status: std::io::Result<ExitStatus>) -> ExecExit {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(code), _) => ExecExit::Exited(code),
            (None, Some(signal)) => ExecExit::Signaled(signal),
            (None, None) => ExecExit::Exited(255),
        },
        Err(_) => ExecExit::Exited(255),
    }
}

/// The key a terminal turns into `signal` for its foreground job, if there is one.
pub(super) fn terminal_key(signal: ExecSignal) -> Option<u8> {
    match signal {
        ExecSignal::Interrupt => Some(0x03),
        ExecSignal::Quit => Some(0x1c),
        _ => None,
    }
}

fn nix_signal(signal: ExecSignal) -> Signal {
    match signal {
        ExecSignal::Interrupt => Signal::SIGINT,
        ExecSignal::Terminate => Signal::SIGTERM,
        ExecSignal::Kill => Signal::SIGKILL,
        ExecSignal::Hangup => Signal::SIGHUP,
        ExecSignal::Quit => Signal::SIGQUIT,
    }
}
