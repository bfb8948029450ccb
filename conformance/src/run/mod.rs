//! `conformance run`: the suite against an operator, with its reports.
//!
//! `run` starts the shared environment once (control plane, fake coderd, operator under test,
//! readiness simulator), publishes it for the Worlds, runs cucumber with the terminal, JUnit,
//! Cucumber-JSON and conformance writers teed together, and tears everything down again.
pub mod args;
mod environment;
mod hooks;
pub(crate) mod summary;

use std::io;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow};
use cucumber::gherkin::tagexpr::TagOperation;
use cucumber::runner::basic::ScenarioType;
use cucumber::{World as _, WriterExt as _, event, gherkin, writer};
use futures::FutureExt as _;
use regex::Regex;

use self::environment::{Role, prepare, teardown};
use self::hooks::after_scenario;
use self::summary::print_summary;
use crate::cluster::StartedCluster;
use crate::features::{all_tags, feature_hashes, parse_features};
use crate::paths::{HTML_REPORT_FILE, KIND_LOGS_DIR, REPORT_FILE};
use crate::report::collector::{Collector, key};
use crate::report::model::{self, ConformanceReport, Implementation, SCHEMA, Suite};
use crate::report::not_applicable::SkipNotApplicable;
use crate::selection::{NOT_STARTED, Selection, list};
use crate::shrink_budget::ShrinkBudget;
use crate::world::{Gate, ProvisionerWorld, install_environment, install_private_environments};
use args::{ClusterTier, OperatorMode, RunArgs};

pub async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    if args.operator_deployment.is_some() && args.operator != OperatorMode::Installed {
        anyhow::bail!(
            "--operator-deployment names the Deployment of an installed operator: use it with --operator installed"
        );
    }
    let tags = match (&args.tags, args.explore) {
        (None, Some(_)) => Some("@generated".to_owned()),
        (tags, _) => tags.clone(),
    };
    let selection = Selection {
        tags: tags
            .as_deref()
            .map(|t| {
                t.parse::<TagOperation>()
                    .map_err(|e| anyhow!("--tags {t:?}: {e}"))
            })
            .transpose()?,
        name: args
            .name
            .as_deref()
            .map(Regex::new)
            .transpose()
            .context("--name is not a valid regex")?,
        real_coderd: args.coderd.is_some(),
        operator_installed: args.operator == OperatorMode::Installed
            && args.operator_deployment.is_none(),
        replicas: matches!(args.cluster, ClusterTier::Local | ClusterTier::Kubeconfig)
            && args.operator == OperatorMode::Reference
            && (args.started.operator_cmd.is_none() || args.started.replica_cmd.is_some()),
        audit_log: args.cluster == ClusterTier::Local,
        coderd_answers_428: args.coderd_version != Some(fake_coderd::CoderdVersion::V2_30_0),
    };
    let mut inputs = args.started.inputs(args.features.as_deref())?;
    if let Some(count) = args.explore {
        inputs.features = explored_features(&inputs, count, args.explore_from)?;
    }
    let features = parse_features(&inputs.features)?;
    if args.list {
        list(&features, &selection);
        return Ok(ExitCode::SUCCESS);
    }
    let report_dir = args.report_dir.clone();
    std::fs::create_dir_all(&report_dir)
        .with_context(|| format!("creating {}", report_dir.display()))?;
    let report_dir = report_dir.canonicalize()?;

    let started_at = jiff::Timestamp::now();
    let clock = Instant::now();
    let (serial, selected) = selected_scenarios(&features, &selection);
    let private_count = match serial.min(args.private_environments()) {
        _ if !wants_private_environments(&args) => 0,
        // With nothing but @serial scenarios, one private environment beside an idle shared one
        // only costs its start.
        1 if serial == selected => 0,
        count => count,
    };
    // Scaled like the deadlines (an invalid --timeout-scale is refused by `prepare`).
    let scale = args
        .timeout_scale
        .filter(|s| s.is_finite() && *s > 0.0)
        .unwrap_or(1.0);
    let shrink_budget = Arc::new(ShrinkBudget::new(
        Duration::from_secs(args.shrink_seconds).mul_f64(scale),
    ));
    let prepared = prepare(&args, &inputs, &report_dir, Role::Shared, &shrink_budget).await?;
    install_environment(prepared.environment.clone())?;
    // Once its @serial scenarios are done, a private environment takes a share of the others.
    let private_seats = args.private_seats(private_count);
    let pool = if private_count > 0 {
        eprintln!(
            "conformance: the {serial} @serial scenario(s) run one at a time in {private_count} private environment(s) beside the others ({}), made while the first scenarios run",
            if args.cluster == ClusterTier::Kind {
                "a kind cluster each, with the chart's operator and the fake coderd"
            } else {
                "a control plane, fake coderds and operator each, the operator in a sandbox"
            }
        );
        Some(install_private_environments(
            serial,
            args.concurrency(),
            private_seats,
        )?)
    } else {
        None
    };
    let private_made = std::sync::Mutex::new(Vec::new());
    // Made while the first scenarios run; then watched for fixture changes as the shared one is.
    let make_private = async {
        let Some(pool) = pool else {
            return std::future::pending::<String>().await;
        };
        let made = futures::future::join_all((1..=private_count).map(|number| {
            prepare(
                &args,
                &inputs,
                &report_dir,
                Role::Private(number),
                &shrink_budget,
            )
        }))
        .await;
        let mut guards = Vec::new();
        for result in made {
            match result {
                Ok(mut private) => {
                    pool.add(private.environment.clone());
                    guards.extend(private.guard.take());
                    private_made
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(private);
                }
                Err(error) => eprintln!(
                    "conformance: a private environment could not be made ({error:#}); its @serial scenarios run in another one, or alone in the shared environment"
                ),
            }
        }
        pool.close_if_empty();
        if guards.is_empty() {
            return std::future::pending::<String>().await;
        }
        futures::future::select_all(guards.iter().map(|g| g.tampered().boxed_local()))
            .await
            .0
    };

    let collector = Collector::default();
    let outcomes = collector.outcomes.clone();
    let junit =
        std::fs::File::create(report_dir.join("junit.xml")).context("creating junit.xml")?;
    let json = std::fs::File::create(report_dir.join("cucumber.json"))
        .context("creating cucumber.json")?;
    // The terminal, JUnit and JSON writers see a scenario that does not apply as skipped; the
    // collector sees the step's failure, which carries the reason.
    let writer = SkipNotApplicable(
        writer::Basic::raw(io::stdout(), writer::Coloring::Auto, 0)
            .summarized()
            .tee::<ProvisionerWorld, _>(writer::JUnit::for_tee(junit, 0))
            .tee::<ProvisionerWorld, _>(writer::Json::for_tee(json)),
    )
    .tee::<ProvisionerWorld, _>(collector.discard_stats_writes().discard_arbitrary_writes())
    .normalized();

    let filter_outcomes = outcomes.clone();
    let filter = move |feature: &gherkin::Feature,
                       rule: Option<&gherkin::Rule>,
                       scenario: &gherkin::Scenario| {
        let tags = all_tags(feature, rule, scenario);
        let skip = selection.skip_reason(&tags, &scenario.name);
        let selected = skip.is_none();
        // A selected scenario is "not started" until cucumber starts it, so one that a stopped
        // run never starts is in the report (and keeps the run from claiming conformance).
        filter_outcomes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .skipped(
                feature,
                scenario,
                skip.unwrap_or_else(|| NOT_STARTED.to_owned()),
            );
        selected
    };
    let hook_outcomes = outcomes.clone();
    let private_lanes = private_count > 0;
    // A scenario starts only while the CPUs have room, unless `--pin-concurrency`.
    let adaptive = !args.pin_concurrency;
    if adaptive {
        crate::load::start_sampling();
    }
    let mut cucumber = ProvisionerWorld::cucumber::<&PathBuf>()
        .with_parser(
            if inputs.features_source == crate::assets::Source::Embedded {
                crate::schedule::SlowFirst::showing_embedded_as_features(&inputs.features)
            } else {
                crate::schedule::SlowFirst::default()
            },
        )
        // With private environments the @serial scenarios wait for one in a slot of their own,
        // beside the shared environment's `--concurrency`, and the private environments' seats
        // once their @serial scenarios are done (see `Gate`).
        .max_concurrent_scenarios(
            args.concurrency()
                + if private_lanes {
                    serial + private_count * private_seats
                } else {
                    0
                },
        )
        .which_scenario(move |feature, rule, scenario| {
            if !private_lanes && is_serial(&all_tags(feature, rule, scenario)) {
                ScenarioType::Serial
            } else {
                ScenarioType::Concurrent
            }
        })
        .retries(args.retry)
        .before(move |feature, rule, scenario, world| {
            let tags = all_tags(feature, rule, scenario);
            world.prompt_outcome = crate::world::expects_prompt_outcome(&tags);
            world.settles_at_end = crate::world::settles_at_end(&tags);
            async move {
                let serial = is_serial(&tags);
                if adaptive && !serial {
                    crate::load::room_for_another(
                        crate::world::running,
                        SCENARIOS_ALWAYS_STARTED,
                        crate::load::SCENARIO_START_LIMIT,
                    )
                    .await;
                }
                let gate = Gate::enter(world, serial).await;
                // A failed hook is a panic in cucumber's eyes (reported as a failed hook).
                world.gate = Some(gate.unwrap_or_else(|error| {
                    panic!("entering the scenario's environment: {error:#}")
                }));
            }
            .boxed_local()
        })
        .after(move |feature, _rule, scenario, finished, world| {
            // A scenario that does not apply to the implementation is skipped: no diagnostics.
            let failed = match finished {
                event::ScenarioFinished::StepFailed(_, _, error) => {
                    crate::report::not_applicable::reason(error).is_none()
                }
                event::ScenarioFinished::BeforeHookFailed(_) => true,
                event::ScenarioFinished::StepPassed | event::ScenarioFinished::StepSkipped => false,
            };
            after_scenario(
                hook_outcomes.clone(),
                key(feature, scenario),
                scenario.name.clone(),
                failed,
                world,
            )
            .boxed_local()
        })
        .with_writer(writer)
        // A step without a definition fails its scenario instead of skipping it silently.
        .fail_on_skipped()
        .with_default_cli();
    if args.fail_fast {
        cucumber = cucumber.fail_fast();
    }
    let run = cucumber.filter_run(&inputs.features, filter);
    // A changed control-plane fixture stops the run at once, with one message.
    let shared_guard = async {
        match &prepared.guard {
            Some(guard) => guard.tampered().await,
            None => std::future::pending().await,
        }
    };
    let aborted = tokio::select! {
        finished = run => Err(finished),
        message = shared_guard => Ok(message),
        message = make_private => Ok(message),
    };
    let (cucumber_failed, aborted) = match aborted {
        // Failed steps are judged from the report (a step that found its scenario does not
        // apply fails in cucumber's runner, and is a reasoned skip in the report's).
        Err(finished) => {
            use cucumber::writer::Stats;
            (
                Stats::<ProvisionerWorld>::parsing_errors(&finished) > 0
                    || Stats::<ProvisionerWorld>::hook_errors(&finished) > 0,
                None,
            )
        }
        Ok(message) => (true, Some(message)),
    };

    if cucumber_failed && let Some(StartedCluster::Kind(cluster)) = &prepared.owned.started_cluster
    {
        cluster.export_logs(&report_dir.join(KIND_LOGS_DIR));
    }
    let window_sized = prepared.environment.observation_window.describe();
    teardown(&prepared.environment, prepared.owned).await;
    let private_made = private_made
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner);
    let private_ready = private_made.len();
    for private in private_made {
        teardown(&private.environment, private.owned).await;
    }

    let mut results = outcomes
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .into_results();
    // Blames each failure on its failing step's rules (filling `failed_rules`).
    let coverage = crate::coverage::for_report(&inputs.features, &mut results);
    let report = ConformanceReport {
        schema: SCHEMA.to_owned(),
        implementation: Implementation {
            name: args.impl_name.clone(),
            version: args.impl_version.clone(),
            url: args.impl_url.clone(),
            contact: args.impl_contact.clone(),
            mode: prepared.mode,
        },
        suite: Suite {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            git_commit: crate::assets::GIT_COMMIT.to_owned(),
            features_source: inputs.features_source.to_string(),
            features: feature_hashes(&inputs.features)?,
        },
        environment: model::Environment {
            tier: prepared.tier,
            coderd: if args.coderd.is_some() {
                "real"
            } else {
                "fake"
            }
            .to_owned(),
            simulated: prepared.simulated,
        },
        setup: Some(model::Setup {
            timeouts: model::SetupTimeouts {
                hold_window_measured: window_sized.clone(),
                ..prepared.setup.timeouts
            },
            ..prepared.setup
        }),
        aborted: aborted.clone(),
        started_at: started_at
            .round(jiff::Unit::Second)
            .unwrap_or(started_at)
            .to_string(),
        duration_ms: u64::try_from(clock.elapsed().as_millis()).unwrap_or(u64::MAX),
        summary: model::summarise(&[]),
        coverage,
        results,
        digest: String::new(),
    }
    .seal()?;
    let path = report_dir.join(REPORT_FILE);
    std::fs::write(&path, report.to_yaml()?)
        .with_context(|| format!("writing {}", path.display()))?;
    // The same report as a page for people, beside it.
    crate::report::html::write(&report, &report_dir.join(HTML_REPORT_FILE))?;
    // cucumber names the embedded features by their scratch path, relative to the working
    // folder when inside it; "features/…" reads better and is the same in every run.
    let root = inputs.bundle.root();
    let strip: Vec<String> = if inputs.features_source == crate::assets::Source::Embedded {
        let full = root.display().to_string();
        let last = root.file_name().map(|n| n.to_string_lossy().into_owned());
        std::iter::once(full.trim_start_matches('/').to_owned())
            .chain(last)
            .map(|p| format!("{p}/"))
            .collect()
    } else {
        Vec::new()
    };
    crate::report::junit::annotate_file(&report_dir.join("junit.xml"), &report.results, &strip)?;
    let pace = summary::Pace {
        scenarios: report
            .results
            .iter()
            .filter(|r| !summary::left_out_by_the_run(r))
            .count(),
        wall: clock.elapsed(),
        limit: args.concurrency(),
        held: adaptive.then(crate::load::held),
        private: (private_ready > 0).then_some(summary::PrivateLanes {
            serial,
            environments: private_ready,
            others: crate::world::moved_to_private_environments(),
        }),
        window: window_sized,
        shrinking: shrink_budget.summary(),
    };
    print_summary(&report, &report_dir, &pace);

    let any_failed = report
        .results
        .iter()
        .any(|r| r.status == model::Status::Failed);
    if let Some(message) = &aborted {
        eprintln!("conformance: STOPPED: {message}");
        return Ok(ExitCode::from(2));
    }
    Ok(if cucumber_failed || any_failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Scenarios that start however busy the CPUs are.
const SCENARIOS_ALWAYS_STARTED: usize = 4;

fn is_serial(tags: &[String]) -> bool {
    tags.iter().any(|t| t == "serial")
}

/// The selected `@serial` scenarios and all selected ones (each example of an outline counted).
fn selected_scenarios(features: &[gherkin::Feature], selection: &Selection) -> (usize, usize) {
    let (mut serial, mut selected) = (0, 0);
    for feature in features {
        for (rule, scenario) in crate::features::scenarios_with_rules(feature) {
            let tags = all_tags(feature, rule, scenario);
            if selection.skip_reason(&tags, &scenario.name).is_some() {
                continue;
            }
            let rows: usize = scenario
                .examples
                .iter()
                .filter_map(|e| e.table.as_ref())
                .map(|t| t.rows.len().saturating_sub(1))
                .sum();
            selected += rows.max(1);
            if is_serial(&tags) {
                serial += rows.max(1);
            }
        }
    }
    (serial, selected)
}

/// Whether the `@serial` scenarios may get private environments: on the local tier, with an
/// operator the suite starts (it starts one more in each) and the fake coderd; on kind, where
/// each is a kind cluster of its own with the chart's operator and the fake coderd.
fn wants_private_environments(args: &RunArgs) -> bool {
    matches!(args.cluster, ClusterTier::Local | ClusterTier::Kind)
        && args.operator == OperatorMode::Reference
        && args.coderd.is_none()
}

/// A copy of the features (in the run's scratch folder) whose generated cases run `count` seeds
/// from `from` (default: from the clock), said on the terminal so that the run can be repeated.
fn explored_features(
    inputs: &crate::assets::Inputs,
    count: u64,
    from: Option<u64>,
) -> anyhow::Result<PathBuf> {
    if count == 0 {
        anyhow::bail!("--explore needs at least one seed");
    }
    let from = from.unwrap_or_else(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        // Small enough to read and type back; seeds 1–8 are the fixed ones.
        1_000 + now.as_secs() % 1_000_000
    });
    let dir = inputs.bundle.root().join("explored-features");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    for entry in std::fs::read_dir(&inputs.features)
        .with_context(|| format!("reading {}", inputs.features.display()))?
    {
        let path = entry?.path();
        let Some(name) = path.file_name() else {
            continue;
        };
        if path.extension().is_none_or(|e| e != "feature") {
            continue;
        }
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let text = if name == "generated.feature" {
            crate::cases::with_seeds(&text, from..from + count)?
        } else {
            text
        };
        std::fs::write(dir.join(name), text)?;
    }
    eprintln!(
        "conformance: exploring {count} generated case(s), seeds {from}–{} (repeat with --explore {count} --explore-from {from})",
        from + count - 1
    );
    Ok(dir)
}
