//! Server-side chart data for the dashboard: `charts.rs` reads a study through the service
//! (its cached snapshot of every trial) and builds each chart's bounded view; `aggregate.rs`
//! holds the pure aggregation it uses (importance, downsampling, contour grids, fronts).
//! Beside `api`, not under it: the API's handlers only parse the request and call in here.

mod aggregate;
pub mod charts;

pub use aggregate::*;
