use clap::Parser;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // Tokens and the database URL may be in this process's environment (AUGUR_TOKEN,
    // AUGUR_DATABASE_URL), and every job it starts runs as this user unless
    // --run-jobs-as: not dumpable, its /proc/PID/environ (and memory, ptrace) is root's
    // alone, so a job cannot read them from its parent. Jobs are dumpable again: execve
    // resets it.
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        eprintln!("augur: cannot keep this process's secrets from its jobs (PR_SET_DUMPABLE): {e}");
        return std::process::ExitCode::FAILURE;
    }
    let cli = augur::cli::Cli::parse();
    // A server logs its work; `augur run` draws progress instead, so only warnings show.
    let default_level = match cli.command {
        augur::cli::Command::Serve { .. } => "info",
        _ => "warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("AUGUR_LOG").unwrap_or_else(|_| EnvFilter::new(default_level)),
        )
        .with_writer(std::io::stderr)
        .init();
    match augur::cli::run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(augur::cli::Failure::Error(message)) => {
            eprintln!("augur: {message}");
            std::process::ExitCode::FAILURE
        }
        Err(augur::cli::Failure::Interrupted) => std::process::ExitCode::from(130),
        Err(augur::cli::Failure::Status(code)) => std::process::ExitCode::from(code),
    }
}
