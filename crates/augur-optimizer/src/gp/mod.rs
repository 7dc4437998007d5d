//! Gaussian-process building blocks for the GP bandit: feature encoding, the Matérn-5/2
//! kernel, MAP fitting and the posterior, and output warping.

pub mod encoding;
pub mod kernel;
pub mod model;
pub mod warping;
