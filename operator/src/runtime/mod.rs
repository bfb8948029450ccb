//! Process wiring: the controller, leader election, health and metrics endpoints, logging.
pub mod controller;
pub mod http;
pub mod leader;
pub mod logging;
