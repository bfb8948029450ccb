//! Conformance suite for CoderProvisioner operators.
//!
//! Infrastructure: `cluster` (control-plane binaries, the local control plane, other tiers),
//! `manifests` (applying YAML), `implementation` (the operator under test), `kubelet` (the local
//! tier's readiness stand-in, contract D-8), `crd_resources` and `coderd_routes` (names of the
//! contract's kinds and coderd's routes). Suite, from the bottom up: `invariants` (the contract's
//! pure checks and the namespace recorder), `world` (a scenario's state and clients),
//! `scenario_checks` (the checks run against a scenario's cluster), `steps` (cucumber), `wait`
//! (polling with deadlines), `schedule` (which scenarios start first), `load` (how busy the CPUs are, so that starts wait for room), `features` (parsing the
//! feature files), `selection` (which scenarios a run executes), `shrink_budget` (the time a run may spend shrinking failed generated cases), `report` and `diagnostics`,
//! `paths` (the repository root, the report folder's file names). Commands: `cli` (the command
//! line, with `shared_args` for the arguments `run` and `bench` share) dispatches to `run`,
//! `verify_report`, `local_cluster`, `bench`, `seeded` and `coverage`; `seeded` runs the suite
//! against deliberately broken builds of the reference operator to prove it can fail; `coverage`
//! maps the contract's rules to scenarios and seeded variants; `attribution` says which step
//! checks which rule, so a failure is blamed on its step's rules.
pub mod assets;
pub mod attribution;
pub mod bench;
pub mod cases;
pub mod cli;
pub mod cluster;
pub mod coderd_routes;
pub mod coverage;
pub mod crd_resources;
pub mod diagnostics;
pub mod features;
pub mod fixture_guard;
pub mod implementation;
pub mod invariants;
pub mod kubelet;
pub mod load;
pub mod local_cluster;
pub mod manifests;
pub mod paths;
pub mod report;
pub mod rule_ids;
pub mod run;
pub mod scenario_checks;
pub mod schedule;
pub mod seeded;
pub mod selection;
pub mod setup;
pub mod shared_args;
pub mod shrink_budget;
pub mod steps;
pub mod verify_report;
pub mod wait;
pub mod world;
