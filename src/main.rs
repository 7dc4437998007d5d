use clap::Parser;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> std::process::ExitCode {
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
    }
}
