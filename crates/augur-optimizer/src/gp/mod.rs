//! Gaussian-process building blocks for the GP bandit: feature encoding, the Matérn-5/2
//! kernel, MAP fitting and the posterior (optionally with a fitted trend as its prior
//! mean), posterior function draws (Thompson sampling), output warping, and the rank
//! statistics that choose between warpings.

pub mod encoding;
pub mod kernel;
pub mod mean;
pub mod model;
pub mod pathwise;
pub mod rank;
pub mod warping;
