//! Augur: a self-hosted hyperparameter tuning service.
//!
//! `model` (validated domain types) → `service` (every change, in one transaction per batch)
//! → `store` (PostgreSQL or SQLite); `api` serves it over HTTP; `cli` is a thin HTTP client.
//! The optimizers live in the pure `augur-optimizer` crate. Start at `docs/architecture.md`.

pub mod api;
pub mod app;
pub mod cli;
pub mod dashboard;
pub mod dispatch;
pub mod insights;
pub mod model;
pub mod serve;
pub mod service;
pub mod store;

pub use app::{App, ServerConfig};
