//! The commands that work on the database itself rather than through the API: `serve`,
//! `migrate`, `token create | list | revoke`.

use std::path::PathBuf;

use super::TokenCommand;
use super::error::{CliError, CliResult};
use crate::app::{App, ServerConfig, open_service};
use crate::service::{Caller, ServiceError};

pub async fn serve(config: ServerConfig) -> CliResult<()> {
    let app = App::build(config).await?;
    let mode = if app.open {
        "open (loopback, no token)"
    } else {
        "bearer tokens required"
    };
    tracing::info!(addr = %app.addr(), auth = mode, "augur is serving");
    println!("augur listening on http://{} ({mode})", app.addr());
    if let Some(addr) = app.optuna_addr() {
        println!(
            "Optuna's gRPC storage on {addr}: GrpcStorageProxy(host=\"{}\", port={})",
            addr.ip(),
            addr.port()
        );
    }
    Ok(app.run().await?)
}

pub async fn migrate(database_url: &str) -> CliResult<()> {
    open_service(database_url, std::path::PathBuf::from(".")).await?;
    println!("migrations applied to {}", redact(database_url));
    Ok(())
}

/// `augur token create | list | revoke`, on the database. The audit trail names the actor
/// `cli:<user>` (the login that ran the command).
pub async fn token_command(command: TokenCommand) -> CliResult<()> {
    let actor = Caller::local(&format!(
        "cli:{}",
        std::env::var("USER").unwrap_or_else(|_| "unknown".into())
    ));
    match command {
        TokenCommand::Create {
            name,
            role,
            expires_in,
            database_url,
        } => {
            let service = open_service(&database_url, PathBuf::from(".")).await?;
            let created = service
                .create_token(&actor, &name, role, expires_in)
                .await
                .map_err(flag_error)?;
            println!("{}", created.token);
            let expiry = created
                .info
                .expires_at
                .map_or_else(|| "never expires".to_string(), |at| format!("expires {at}"));
            eprintln!("token {name:?} ({role}, {expiry}) created; it is shown only once");
        }
        TokenCommand::List { database_url } => {
            let service = open_service(&database_url, PathBuf::from(".")).await?;
            println!(
                "{:<24}  {:<8}  {:<20}  {:<20}  last used",
                "name", "role", "created", "expires"
            );
            let time = |t: Option<chrono::DateTime<chrono::Utc>>, none: &str| {
                t.map_or_else(
                    || none.to_string(),
                    |t| t.format("%Y-%m-%d %H:%M:%S").to_string(),
                )
            };
            for t in service.list_tokens().await? {
                println!(
                    "{:<24}  {:<8}  {:<20}  {:<20}  {}",
                    t.name,
                    t.role.as_str(),
                    time(Some(t.created_at), ""),
                    time(t.expires_at, "never"),
                    time(t.last_used_at, "never")
                );
            }
        }
        TokenCommand::Revoke { name, database_url } => {
            let service = open_service(&database_url, PathBuf::from(".")).await?;
            service
                .revoke_token(&actor, &name)
                .await
                .map_err(flag_error)?;
            eprintln!("token {name:?} revoked");
        }
    }
    Ok(())
}

/// The service names its input; the user gave it as a flag.
fn flag_error(e: ServiceError) -> CliError {
    match e {
        ServiceError::Invalid(v) => {
            CliError::Usage(format!("--{}: {}", v.field.replace('_', "-"), v.message))
        }
        other => other.into(),
    }
}

/// The URL with any password hidden, for messages.
fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        _ => url.to_string(),
    }
}
