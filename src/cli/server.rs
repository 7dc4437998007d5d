//! The commands that work on the database itself rather than through the API: `serve`,
//! `migrate`, `token create`.

use super::error::CliResult;
use crate::app::{App, ServerConfig, open_service};

pub async fn serve(config: ServerConfig) -> CliResult<()> {
    let app = App::build(config).await?;
    let mode = if app.open {
        "open (loopback, no token)"
    } else {
        "bearer tokens required"
    };
    tracing::info!(addr = %app.addr(), auth = mode, "augur is serving");
    println!("augur listening on http://{} ({mode})", app.addr());
    Ok(app.run().await?)
}

pub async fn migrate(database_url: &str) -> CliResult<()> {
    open_service(database_url, std::path::PathBuf::from(".")).await?;
    println!("migrations applied to {}", redact(database_url));
    Ok(())
}

pub async fn create_token(database_url: &str, name: &str) -> CliResult<()> {
    let service = open_service(database_url, std::path::PathBuf::from(".")).await?;
    let token = service.create_token(name).await.map_err(|e| match e {
        // The service names its input; the user gave it as a flag.
        crate::service::ServiceError::Invalid(v) => {
            super::CliError::Usage(format!("--{}: {}", v.field, v.message))
        }
        other => other.into(),
    })?;
    println!("{token}");
    eprintln!("token {name:?} created; it is shown only once");
    Ok(())
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
