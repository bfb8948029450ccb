//! Process wiring: the controller, leader election, metrics, health endpoints and logging.
pub mod controller;
pub mod http;
pub mod leader;
pub mod logging;
pub mod metrics;
