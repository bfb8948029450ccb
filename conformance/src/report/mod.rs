//! Reports of a run.
//!
//! JUnit XML and Cucumber JSON come from cucumber's own writers (wired in [`crate::run`]), which
//! see a scenario that does not apply to the implementation as skipped ([`not_applicable`]); this
//! module adds the conformance report: [`collector`] turns cucumber events into per-scenario
//! outcomes, [`model`] is the YAML document (with a digest over its content so an edited result
//! is detected) and `verify-report`'s checks, [`html`] the page a person reads in a browser.
pub mod collector;
pub mod html;
pub mod junit;
pub mod model;
pub mod not_applicable;

pub use collector::{Collector, Outcomes};
pub use model::{
    ConformanceReport, Level, RuleCoverage, RuleScenario, ScenarioResult, Status, verify,
};
