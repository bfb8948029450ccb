//! Seeded bugs: proves the suite can fail.
//!
//! A seeded variant is a patch of the reference operator: a small diff of its source, or of its
//! RBAC or CRD manifests, kept as `conformance/seeded/<name>.patch` with a header naming it, the
//! rules it breaks and (when they are not simply the scenarios of those rules) the scenarios
//! that run against it; see [`parse_header`]. The reference operator itself carries no trace of
//! its variants.
//!
//! The runner copies the workspace once into a scratch folder, and for each variant resets the
//! copy, applies the patch (`git apply`), builds the operator there (in the workspace's target
//! directory under another package and binary name, so that only the operator crate recompiles
//! and the reference's artifacts stay as they are) and runs the suite against that binary, under the copy's
//! `config/rbac` (and `config/crd`) when the patch changed them, with only the scenarios of the
//! variant. Builds run one after another while earlier variants' suites run. The **unbroken**
//! operator runs on the union of the variants' scenarios, twice by default (`--unbroken-runs`).
//!
//! A variant is *caught* when a scenario fails on a step that checks one of the rules it breaks
//! (the report's `failed_rules`, see [`crate::attribution`]), while the unbroken operator passes
//! every selected scenario in both of its runs. A variant whose selection fails only on other
//! rules, or not at all, is *MISSED*, and the run fails; so does a patch that does not apply or
//! does not compile (an ERROR naming it). A variant that writes the control plane
//! ([`Breakage::ControlPlaneWriter`], `# verdict: fixture-guard`) breaks the suite's fixture, not
//! a rule: it is caught when the fixture guard stops its run, and the same variant under
//! `--control-plane-access read-only` must pass every selected scenario.
//!
//! A *legal* variant (`conformance/legal/`, `# permits:`) is the mirror: a change the contract
//! permits, which must pass every scenario it runs. Legal variants run in stacks (`stack`).
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::LazyLock;
use std::time::Instant;

use anyhow::{Context as _, anyhow, bail};
use clap::Args;
use futures::{FutureExt as _, StreamExt as _};

use crate::fixture_guard::is_fixture_change;
use crate::implementation::{REFERENCE_BINARY, REFERENCE_BINARY_ENV, reference_operator_binary};
use crate::report::model::{ConformanceReport, Status};

mod binary_cache;
mod catches;
mod stack;
use stack::{Stack, StackOnly};

/// Folder of the built-in variants, relative to the repository root.
pub const PATCH_DIR: &str = "conformance/seeded";
/// Folder of the built-in legal variants: changes the contract permits (`# permits:`).
pub const LEGAL_DIR: &str = "conformance/legal";

/// The built-in variants: `(file name in [PATCH_DIR], the patch)`, in the order they are run
/// and listed. A test checks that this is exactly the folder's `*.patch` files.
macro_rules! built_in {
    ($folder:literal: $($name:literal),* $(,)?) => {
        &[$(
            (
                concat!($name, ".patch"),
                include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/", $folder, "/", $name, ".patch")),
            )
        ),*]
    };
}

#[rustfmt::skip]
pub const BUILT_IN: &[(&str, &str)] = built_in!["seeded":
    // The PR's three bugs.
    "rbac-without-pod-verbs",
    "key-status-not-persisted-early",
    "daemon-without-coder-command",
    "daemon-with-organization-env",
    // The tutorial's rules.
    "unowned-key-secret-adopted",
    "key-secret-of-another-provisioner-adopted",
    "credential-secrets-unchecked",
    "credential-origin-prefix-match",
    "cleanup-by-spec-key-name",
    "cleanup-without-key-calls-coderd",
    "finalizer-kept-while-coderd-down",
    "rate-limited-cleanup-retried",
    "error-body-decoded-strictly",
    "replacement-announced-after-delete",
    "unstored-key-left-in-coderd",
    "child-refusal-only-logged",
    // Two replicas (leader_election.feature).
    "paused-leader-unfenced",
    "fence-trusts-term-token",
    "standby-waits-for-expiry",
    "deleted-without-finalizer-reconciled",
    "deployment-updated-despite-invalid-credentials",
    "not-entitled-ignored",
    // Stability.
    "status-rewritten-every-reconcile",
    "key-rotated-on-restart",
    "tags-ignored-on-drift",
    "metadata-edits-reconciled",
    // Rate limiting.
    "rate-limit-retried-without-backoff",
    "backoff-not-reset-after-success",
    // Which key is deleted, and when.
    "cleanup-by-recorded-name",
    "drift-rotation-by-recorded-name",
    "cleanup-in-background",
    "cleanup-organization-from-spec",
    "rotation-stops-on-delete-failure",
    // Secrets and credentials.
    "session-token-logged",
    "credential-origin-port-ignored",
    "refused-secret-lists-keys",
    "secret-key-ignored",
    "key-secret-without-block-owner-deletion",
    // Status and entitlement.
    "phase-ready-when-deployment-exists",
    "tags-hash-over-keys-only",
    "transition-time-always-now",
    "observed-generation-frozen",
    "entitlements-unauthorized-as-query-failure",
    // Blind mistakes (batch 1, 2026-12-02: written by someone who had not read the features),
    // missed by the suite of 3380be8 and caught by its second design.
    "fresh-grace-period-asks-coderd",
    "status-org-name-from-coderd",
    "emptied-key-secret-counts-as-usable",
    "non-controller-owner-ref-accepted",
    "optional-credential-refs-skipped",
    "retry-after-as-floor",
    "cleanup-checks-entitlements",
    "entitlements-without-bypass-header",
    "control-plane-image-wins",
    "control-plane-ref-change-not-drift",
    // Blind mistakes (batch 2, 2026-12-02), missed by the second design when measured, then
    // caught by every shape of the prerequisites (a blank data key, an absent flag, a token
    // Secret without its key).
    "blank-token-key-not-defaulted",
    "access-ready-absent-treated-as-ready",
    "token-key-absent-reported-ref-invalid",
    // Blind mistakes (batch 2) still missed after it, caught once their rule was checked in every
    // shape: a provisioner already in `default`, every Secret reference, every grant, every
    // child before the Deployment, every reason the token may not be used.
    "organization-cache-folds-case",
    "control-plane-watch-not-granted",
    "credential-watch-first-reference-only",
    "deployment-applied-before-rbac",
    "cleanup-ignores-operator-access",
    // Checks that hold in every scenario, each proved by a variant only it can see in the
    // variant's selection: Secrets the suite wrote (R-SEC-15), abandoned keys (R-KEY-25), the
    // whole Deployment spec (R-CRED-8), every status write seen by the namespace watch (R-ST-9).
    "token-secret-labelled-for-watch",
    "moved-key-looked-up-in-new-organization",
    "replicas-followed-before-the-gates",
    "rollout-reported-as-progressing",
    // The operator under faults, round three (issue 26).
    "rate-limited-lookup-discards-key",
    "key-created-before-secret-checked",
    // Blind batch 4's misses (2026-12-02): a name at the limit itself, a label value in
    // another case, a list of origins without spaces, a token that may not bypass the limiter.
    "workload-name-shortened-at-63",
    "credential-label-value-case-folded",
    "credential-destinations-split-on-comma-space",
    "bypass-fallback-on-412",
    // Blind batch 5's observable misses (2026-12-02): an empty organization name, a failure
    // other than 429 between two 429s.
    "empty-organization-name-not-defaulted",
    "rate-limit-count-kept-across-failures",
    // Blind batch 6's observable miss (2026-12-03): a label value left unshortened.
    "long-instance-label-not-shortened",
    // One-line mistakes the suite was found to miss (2026-12-04): the default organization
    // looked up by its usual name.
    "default-organization-looked-up-as-coder",
    // Blind batch 7's misses (2026-12-04): readiness from all replicas, a stale check trusted.
    "ready-only-when-all-replicas-ready",
    "stale-not-entitled-trusted",
    // Blind batch 8's observable misses (2026-12-04): a tag added on the way, a key call's 401
    // blamed on operator access, the rate-limit message with a delay appended.
    "default-scope-tag-added",
    "key-call-401-blamed-on-operator-access",
    "rate-limited-message-carries-delay",
    // Blind batch 10's misses (2026-12-04): a userinfo origin, a 403 on a kept key's lookup,
    // a deposed leader's unfenced delete, a generation no child shows, a rate-limited lookup
    // that goes on, a status overwritten by another client, a narrowed key-name pattern, an
    // unhandled SIGTERM.
    "credential-destination-username-accepted",
    "daemon-key-403-taken-as-refusal",
    "key-deletes-unfenced",
    "observed-generation-moves-only-on-deployment-write",
    "rate-limited-lookup-still-deploys",
    "status-edits-start-no-pass",
    "upper-case-key-name-rejected",
    "sigterm-not-handled",
    // A deposed leader's writes (issue 37, 2026-12-05).
    "key-secret-applied-unconditionally",
    "unidentified-stored-key-left-at-cleanup",
    "events-unfenced",
    // Blind batch 11's limit-edge misses (2026-12-05), caught by the generator's boundaries.
    "default-key-name-at-64-shortened",
    "instance-label-at-63-shortened",
    "long-secret-name-one-past-253",
    "grace-period-zero-becomes-600",
    // Faults as a dimension of the generated cases (issue 38, 2026-12-05): a fault in a
    // rotation (blind batch 11's miss), one status of a family handled unlike its siblings.
    "pending-lookup-keeps-previous-key-id",
    "lookup-502-not-retryable",
    // Several coderds on one host as a dimension of the generated cases (issue 38,
    // 2026-12-05): blind batch 11's misses of a cache and a comparison keyed by the host alone.
    "org-cache-keyed-by-host-only",
    "url-move-same-host-retires-at-new-coderd",
    // Blind batch 13's miss (2026-12-05), caught once a control plane's URL moves in a case.
    "url-drift-ignores-port",
    // Blind batch 12's single-status miss (2026-12-05): a 503 on a key create taken for a 429,
    // caught once `RateLimited` without any 429 is a finding.
    "create-503-reported-as-rate-limited",
    // A deposed leader's writes, every kind (issue 54, 2026-12-07): each caught by a pause
    // right after one of the pass's writes.
    "deployment-created-unconditionally",
    "rbac-applied-unfenced",
    "status-written-unfenced",
    // The suite's own fixture.
    "control-plane-status-rewritten",
];

/// The built-in legal variants, `(file name in [LEGAL_DIR], the patch)`; a test checks that this
/// is exactly that folder's `*.patch` files.
#[rustfmt::skip]
pub const BUILT_IN_LEGAL: &[(&str, &str)] = built_in!["legal":
    // D-11, replicas: the Lease released after the controller stops (a seeded bug until D-11), a
    // Lease of another name, and controller-runtime's defaults (one worker, :8080,
    // `<hostname>_<uuid>`, leader election always on, 2 s jittered retry, `sh -c` without exec).
    "lease-released-after-the-controller-stops",
    "other-lease-name",
    "controller-runtime-shaped",
    // D-12: a new key's id learned by listing keys; the scenarios that fault the other route
    // are skipped for it with that reason.
    "key-id-by-listing",
    // D-13, timings inside the rules' bounds: requeues, Retry-After, the request timeout, the
    // not-owned re-check, credential Secrets re-checked instead of watched, no periodic resync,
    // entitlements asked every pass, one worker beside a hanging coderd.
    "requeue-timings-within-bounds",
    "retry-after-ignored",
    "coderd-timeout-10s",
    "not-owned-recheck-55s",
    "credential-recheck-by-requeue-20s",
    "no-periodic-resync",
    "entitlements-asked-every-pass",
    "hanging-coderd-starves-others",
    // D-13, what is said and how it is written: messages, optional Events, logs, status by merge
    // patch or update, the finalizer by kube-runtime's helper or a JSON patch, a field manager,
    // the order of independent reads.
    "other-message-text",
    "daemon-key-401-worded-as-session-token",
    "no-optional-events",
    "json-logs",
    "status-by-merge-patch",
    "status-by-update",
    "finalizer-by-kube-runtime-helper",
    "finalizer-by-own-json-patch",
    "other-field-manager",
    "independent-reads-reordered",
    // D-6: the implementation's own managed-by value, shortening hash, key checksum format and
    // extra metadata on children.
    "managed-by-own-value",
    "other-shortening-hash",
    "key-checksum-other-format",
    "extra-child-metadata",
    // Blind legal batch 2 (2026-12-05): written from the contract by someone who had not read the
    // suite; all ten passed the whole suite before anything was changed for them.
    "bypass-header-on-every-key-step-request",
    "coderd-requests-accept-json",
    "conditions-sorted-by-type",
    "create-omits-empty-tags",
    "key-lookup-sends-session-token",
    "list-before-first-create",
    "long-key-name-shortened-to-60",
    "organization-looked-up-every-time",
    "rate-limit-backoff-half-jitter",
    "workload-name-keeps-40-characters",
    // Issue 51 (2026-12-07): shapes a blind operator took that the suite failed or could miss:
    // status written at each stage, observedGeneration on every pass (together: intermediate
    // versions under the new generation, D-15), children by create and update, extra `-o wide`
    // columns and short names, a refused lookup of a new key recovered by listing (D-12).
    "status-written-at-each-stage",
    "observed-generation-on-every-pass",
    "children-by-create-and-update",
    "wide-columns-and-short-names",
    "refused-key-lookup-recovered-by-listing",
];

/// How a variant is judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Breakage {
    /// It breaks rules (`# breaks:`): caught when a scenario fails on a step checking one.
    Rules,
    /// It writes the control planes it reads (`# verdict: fixture-guard`): it breaks no rule,
    /// only the suite's control-plane fixture, and is caught when the fixture guard stops its
    /// run; under `--control-plane-access read-only` it must pass.
    ControlPlaneWriter,
    /// A legal variant (`# permits:`): a change the contract permits, so every selected scenario
    /// must pass (a scenario skipped with its reason, e.g. one that does not apply to it under
    /// D-12, is no failure). Any failure is a false failure of the suite.
    Legal,
}

/// A patch file's header: its leading `#` lines.
///
/// ```text
/// # name: tags-ignored-on-drift
/// # breaks: R-KEY-13
/// # scenarios: @R-KEY-13 and not @slow      (optional)
/// # verdict: fixture-guard                  (optional: rules, the default, or fixture-guard)
/// # any other line starting with '#' is ignored (a description, "caught by: …")
/// diff --git a/operator/src/… b/operator/src/…
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PatchHeader {
    /// Kebab-case, named after what it breaks.
    pub name: String,
    /// Contract rule ids it breaks (`# breaks: none` for none).
    pub breaks: Vec<String>,
    /// Rules whose failure truly follows from the broken ones (`# consequences:`): blaming them
    /// too is no imprecision of the suite's blame.
    pub consequences: Vec<String>,
    /// A cucumber tag expression selecting the scenarios run against it; `None`: the scenarios
    /// tagged with any rule of [`PatchHeader::breaks`].
    pub scenarios: Option<String>,
    pub breakage: Breakage,
    /// Rule and decision ids that permit a legal variant (`# permits:`).
    pub permits: Vec<String>,
    /// A legal variant's start: `# operator-cmd:` / `# replica-cmd:`, shell lines in which
    /// `{operator}` stands for the variant's binary (`run --operator-cmd`, `--replica-cmd`).
    pub operator_cmd: Option<String>,
    pub replica_cmd: Option<String>,
    /// Whether a diff follows the header (a legal variant may change only how it is started).
    pub has_diff: bool,
}

/// Reads a patch file's header (see [`PatchHeader`]): the `#` lines (and blank lines) before the
/// diff. Fails with a message saying what is missing or malformed.
pub fn parse_header(text: &str) -> Result<PatchHeader, String> {
    let mut name = None;
    let mut breaks = None;
    let mut consequences = None;
    let mut scenarios = None;
    let mut verdict = None;
    let mut permits = None;
    let mut operator_cmd = None;
    let mut replica_cmd = None;
    let mut has_diff = false;
    for line in text.lines() {
        let Some(comment) = line.strip_prefix('#') else {
            if line.trim().is_empty() {
                continue;
            }
            has_diff = line.starts_with("diff ") || line.starts_with("--- ");
            break;
        };
        let Some((key, value)) = comment.split_once(':') else {
            continue;
        };
        let slot = match key.trim().to_ascii_lowercase().as_str() {
            "name" => &mut name,
            "breaks" => &mut breaks,
            "consequences" => &mut consequences,
            "scenarios" => &mut scenarios,
            "verdict" => &mut verdict,
            "permits" => &mut permits,
            "operator-cmd" => &mut operator_cmd,
            "replica-cmd" => &mut replica_cmd,
            _ => continue,
        };
        if slot.is_some() {
            return Err(format!("`# {}:` is given twice", key.trim()));
        }
        *slot = Some(value.trim().to_owned());
    }
    let name = name.ok_or("no `# name:` line")?;
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    {
        return Err(format!(
            "the name {name:?} is not kebab-case (a-z, 0-9 and -)"
        ));
    }
    let rule_list = |key: &str, list: String| -> Result<Vec<String>, String> {
        let rules: Vec<String> = if list.eq_ignore_ascii_case("none") {
            Vec::new()
        } else {
            list.split(',').map(|rule| rule.trim().to_owned()).collect()
        };
        match rules.iter().find(|rule| {
            rule.is_empty() || rule.contains(char::is_whitespace) || rule.starts_with('@')
        }) {
            Some(bad) => Err(format!(
                "`# {key}:` holds {bad:?}, not a rule id (write rule ids like R-KEY-4, comma-separated)"
            )),
            None => Ok(rules),
        }
    };
    if let Some(permits) = permits {
        let permits = rule_list("permits", permits)?;
        if breaks.is_some() || verdict.is_some() {
            return Err(
                "a legal variant (`# permits:`) neither breaks a rule nor takes a `# verdict:`"
                    .to_owned(),
            );
        }
        if permits.is_empty() {
            return Err(
                "`# permits:` names no rule or decision that permits the change".to_owned(),
            );
        }
        if !has_diff && operator_cmd.is_none() && replica_cmd.is_none() {
            return Err(
                "no diff after the header, and no `# operator-cmd:` or `# replica-cmd:` to run"
                    .to_owned(),
            );
        }
        validate_scenarios(scenarios.as_deref())?;
        return Ok(PatchHeader {
            name,
            breaks: Vec::new(),
            consequences: Vec::new(),
            scenarios,
            breakage: Breakage::Legal,
            permits,
            operator_cmd,
            replica_cmd,
            has_diff,
        });
    }
    if operator_cmd.is_some() || replica_cmd.is_some() {
        return Err(
            "`# operator-cmd:` and `# replica-cmd:` belong to legal variants (`# permits:`)"
                .to_owned(),
        );
    }
    let breaks = breaks.ok_or(
        "no `# breaks:` line (rule ids, comma-separated, or none), nor `# permits:` for a legal variant",
    )?;
    let breaks = rule_list("breaks", breaks)?;
    let consequences = match consequences {
        Some(list) => rule_list("consequences", list)?,
        None => Vec::new(),
    };
    let breakage = match verdict.as_deref() {
        None | Some("rules") => Breakage::Rules,
        Some("fixture-guard") => Breakage::ControlPlaneWriter,
        Some(other) => {
            return Err(format!(
                "`# verdict: {other}` is neither `rules` nor `fixture-guard`"
            ));
        }
    };
    if breakage == Breakage::Rules && breaks.is_empty() {
        return Err(
            "`# breaks:` names no rule, so nothing could catch it (only `# verdict: fixture-guard` breaks none)"
                .to_owned(),
        );
    }
    validate_scenarios(scenarios.as_deref())?;
    if scenarios.is_none() && breaks.is_empty() {
        return Err("it breaks no rule, so `# scenarios:` must say what to run".to_owned());
    }
    if !has_diff {
        return Err("no diff after the header".to_owned());
    }
    Ok(PatchHeader {
        name,
        breaks,
        consequences,
        scenarios,
        breakage,
        permits: Vec::new(),
        operator_cmd: None,
        replica_cmd: None,
        has_diff,
    })
}

fn validate_scenarios(scenarios: Option<&str>) -> Result<(), String> {
    match scenarios {
        Some(expression)
            if expression
                .parse::<cucumber::gherkin::tagexpr::TagOperation>()
                .is_err() =>
        {
            Err(format!(
                "`# scenarios: {expression}` is not a cucumber tag expression"
            ))
        }
        _ => Ok(()),
    }
}

/// One seeded variant: its header and its patch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Variant {
    pub name: String,
    pub breakage: Breakage,
    /// Contract rule ids the variant breaks.
    pub breaks: Vec<String>,
    /// Rules whose failure follows from the broken ones (`# consequences:`).
    pub consequences: Vec<String>,
    /// `# scenarios:`, if given.
    pub scenarios: Option<String>,
    /// What permits a legal variant (`# permits:`).
    pub permits: Vec<String>,
    /// A legal variant's start commands (`{operator}`: its binary).
    pub operator_cmd: Option<String>,
    pub replica_cmd: Option<String>,
    /// Whether the patch holds a diff (a legal variant may only change its start).
    pub has_diff: bool,
    /// Where the patch comes from (`conformance/seeded/<file>`, or the file given).
    pub origin: String,
    /// The whole patch file, header included (`git apply` skips it).
    pub patch: String,
}

impl Variant {
    /// The variant of a patch file's text; `origin` names it in errors.
    pub fn parse(origin: &str, text: &str) -> anyhow::Result<Self> {
        let header = parse_header(text).map_err(|why| anyhow!("{origin}: {why}"))?;
        Ok(Self {
            name: header.name,
            breakage: header.breakage,
            breaks: header.breaks,
            consequences: header.consequences,
            scenarios: header.scenarios,
            permits: header.permits,
            operator_cmd: header.operator_cmd,
            replica_cmd: header.replica_cmd,
            has_diff: header.has_diff,
            origin: origin.to_owned(),
            patch: text.to_owned(),
        })
    }

    /// Reads a patch file given on the command line.
    pub fn read(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the patch {}", path.display()))?;
        Self::parse(&path.display().to_string(), &text)
    }

    /// Cucumber tag expression selecting the scenarios run against the variant; empty for the
    /// whole suite (a legal variant without `# scenarios:`).
    pub fn tag_expression(&self) -> String {
        self.scenarios
            .clone()
            .unwrap_or_else(|| tag_expression(self.breaks.iter().map(String::as_str)))
    }

    pub fn is_legal(&self) -> bool {
        self.breakage == Breakage::Legal
    }

    /// Whether a failure blamed on `failed_rules` catches this variant.
    fn is_caught_by(&self, failed_rules: &[String]) -> bool {
        failed_rules.iter().any(|rule| self.breaks.contains(rule))
    }
}

fn tag_expression<'a>(rules: impl Iterator<Item = &'a str>) -> String {
    rules
        .map(|rule| format!("@{rule}"))
        .collect::<Vec<_>>()
        .join(" or ")
}

/// Every built-in seeded variant, from [`BUILT_IN`] (a header that does not parse is a bug of
/// this crate, caught by its tests).
pub fn variants() -> &'static [Variant] {
    static VARIANTS: LazyLock<Vec<Variant>> = LazyLock::new(|| parse_built_in(PATCH_DIR, BUILT_IN));
    &VARIANTS
}

/// Every built-in legal variant, from [`BUILT_IN_LEGAL`].
pub fn legal_variants() -> &'static [Variant] {
    static VARIANTS: LazyLock<Vec<Variant>> =
        LazyLock::new(|| parse_built_in(LEGAL_DIR, BUILT_IN_LEGAL));
    &VARIANTS
}

fn parse_built_in(dir: &str, files: &[(&str, &str)]) -> Vec<Variant> {
    files
        .iter()
        .map(|(file, text)| {
            Variant::parse(&format!("{dir}/{file}"), text)
                .unwrap_or_else(|error| panic!("built-in variant: {error:#}"))
        })
        .collect()
}

#[derive(Args, Debug, Clone)]
pub struct SeededArgs {
    /// Only these variants (comma-separated names); default: all.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Run this patch file instead of the built-in variants (repeatable): the same header as
    /// those in conformance/seeded (`# name:`, `# breaks:`, optional `# scenarios:`), then a
    /// diff that `git apply` takes from the repository root.
    #[arg(long = "patch", value_name = "FILE")]
    pub patches: Vec<PathBuf>,
    /// Print the variants with the rule ids they break (the tags selecting their scenarios).
    #[arg(long)]
    pub list: bool,
    /// Run the built-in legal variants (conformance/legal: changes the contract permits, each of
    /// which must pass every scenario it runs) instead of the seeded bugs.
    #[arg(long)]
    pub legal: bool,
    /// Run each legal variant on its own. By default the legal variants that apply together
    /// and start the same way run as one operator (a stack) in one suite run; a stack that fails
    /// has each member re-run alone on the scenarios it failed, so the verdict names the variant.
    #[arg(long)]
    pub alone: bool,
    /// Suite runs at the same time, at most; each starts its own local control plane. Past
    /// two, a run starts only while the CPUs have room (below 90 % busy over 5 s): most runs wait out
    /// observation windows.
    #[arg(long, default_value_t = 8)]
    pub jobs: usize,
    /// Scenarios at the same time within one suite run (the unbroken operator's runs, of every
    /// variant's scenarios, are the longest).
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Runs of the unbroken operator on the union of the variants' scenarios: a catch counts only
    /// when it passes them in every run. CI gives 1: its `cargo test` has already run the whole
    /// suite once on the same operator.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    pub unbroken_runs: u32,
    /// Run each variant on every scenario of its rules at once, not first on the scenarios that
    /// caught it in the last whole run (conformance/seeded/catches.tsv).
    #[arg(long)]
    pub every_scenario: bool,
    /// Record the scenarios that caught each variant in conformance/seeded/catches.tsv.
    #[arg(long)]
    pub write_catches: bool,
    /// Build every variant, even one whose binary was built before from the same sources,
    /// toolchain and patch (kept in ~/.cache/coder-provisioner-conformance/seeded-operators).
    #[arg(long)]
    pub rebuild: bool,
    /// Multiplies every wait deadline of the suite (slow machines).
    #[arg(long)]
    pub timeout_scale: Option<f64>,
    /// Working folder: the scratch copy of the workspace, each variant's binary, build log and
    /// manifests, and one report folder per run (default: target/seeded-bugs of this repository).
    #[arg(long)]
    pub out_dir: Option<PathBuf>,
    /// The unbroken operator (default: found as `conformance run` finds the reference operator).
    #[arg(long)]
    pub reference_operator: Option<PathBuf>,
    /// The `conformance` executable that runs the suite (default: this executable).
    #[arg(long)]
    pub suite_bin: Option<PathBuf>,
    /// Folder with the feature files (default: the workspace's, as copied when the run started,
    /// so that editing them meanwhile changes no run).
    #[arg(long)]
    pub features: Option<PathBuf>,
}

/// What a variant runs as: its binary and the manifests its patch changed.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Prepared {
    operator: PathBuf,
    /// The operator's binary was built before from the same inputs ([`binary_cache`]).
    cached: bool,
    /// The patched `config/rbac`, when the patch changed it.
    rbac: Option<PathBuf>,
    /// The patched `config/crd`, when the patch changed it.
    crds: Option<PathBuf>,
}

/// A variant's [`Prepared`] once built; `Err` says why it could not be (it names the patch).
type PreparedFuture =
    futures::future::Shared<futures::future::BoxFuture<'static, Result<Prepared, String>>>;

/// One `conformance run`.
#[derive(Clone)]
struct PlannedRun {
    /// `None` = the unbroken operator on the union of the variants' selections.
    variant: Option<Variant>,
    /// Which run of the unbroken operator (1, 2).
    round: usize,
    /// With `--control-plane-access read-only`: a run that must pass, not a verdict.
    read_only: bool,
    tags: String,
    /// `run --name`: a stack's member re-run alone on the scenarios the stack failed.
    name: Option<String>,
    /// `name` holds the scenarios that caught the variant last time ([`catches`]): when they do
    /// not catch it now, it runs again on all its scenarios.
    recorded_catches: bool,
    /// `run --fail-fast`: a seeded variant's run ends at its first failure, which mostly
    /// catches it; one that failed elsewhere first runs again in full ([`next_attempt`]).
    fail_fast: bool,
    report_dir: PathBuf,
}

impl PlannedRun {
    fn label(&self) -> String {
        match (&self.variant, self.read_only) {
            (None, _) => format!("unbroken operator (run {})", self.round),
            (Some(variant), false) => variant.name.clone(),
            (Some(variant), true) => format!("{} (control-plane access read-only)", variant.name),
        }
    }
}

/// A scenario as the report names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScenarioRef {
    pub feature: String,
    pub line: usize,
    pub name: String,
    /// Why it failed or was skipped (the failing step and its error), from the report.
    pub reason: Option<String>,
    /// The rules its failure is blamed on (the report's `failed_rules`).
    pub failed_rules: Vec<String>,
}

impl std::fmt::Display for ScenarioRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{} \"{}\"", self.feature, self.line, self.name)
    }
}

/// What one suite run found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunOutcome {
    Report {
        passed: Vec<ScenarioRef>,
        failed: Vec<ScenarioRef>,
        /// Selected by the tags but skipped (e.g. missing prerequisites): not a pass.
        skipped: Vec<ScenarioRef>,
        /// Why the run was stopped before its end (the report's `aborted`).
        aborted: Option<String>,
    },
    /// The suite produced no report (setup failed), or the variant could not be built;
    /// nothing can be concluded.
    Error(String),
}

/// The summary of a report: selected scenarios by outcome.
pub fn outcome_of(report: &ConformanceReport) -> RunOutcome {
    let mut passed = Vec::new();
    let mut failed = Vec::new();
    let mut skipped = Vec::new();
    for result in &report.results {
        let scenario = ScenarioRef {
            feature: result.feature.clone(),
            line: result.line,
            name: result.scenario.clone(),
            reason: result.reason.clone(),
            failed_rules: result.failed_rules.clone(),
        };
        match result.status {
            Status::Passed => passed.push(scenario),
            Status::Failed => failed.push(scenario),
            Status::Skipped
                if result
                    .reason
                    .as_deref()
                    .is_some_and(|r| r.starts_with(crate::selection::NOT_SELECTED)) => {}
            Status::Skipped => skipped.push(scenario),
        }
    }
    RunOutcome::Report {
        passed,
        failed,
        skipped,
        aborted: report.aborted.clone(),
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// These scenarios failed against the variant on a step checking a rule it breaks.
    Caught(Vec<ScenarioRef>),
    /// The fixture guard stopped the run with this message: how a
    /// [`Breakage::ControlPlaneWriter`] is caught.
    Stopped(String),
    /// Not caught: no scenario failed on a rule it breaks (maybe none was selected).
    Missed {
        passed: usize,
        /// Scenarios that failed, but on other rules.
        failed: Vec<ScenarioRef>,
        skipped: usize,
    },
    /// A legal variant passed every scenario it ran (`skipped`: with a reason, e.g. not
    /// applicable to it).
    Passed { passed: usize, skipped: usize },
    /// A legal variant failed: the suite's false failure, with what failed and why.
    FalselyFailed(String),
    /// The run itself failed, or the patch did not apply or compile; nothing can be concluded.
    Error(String),
}

/// The verdict for one variant's run: a scenario failing on a step that checks a rule the
/// variant breaks catches a bug in the operator's behaviour, only the fixture guard's stop
/// catches a control-plane writer, and a run stopped for anything else proves nothing.
pub fn verdict(variant: &Variant, outcome: &RunOutcome) -> Verdict {
    let writer = variant.breakage == Breakage::ControlPlaneWriter;
    if variant.is_legal() {
        return legal_verdict(outcome);
    }
    match outcome {
        RunOutcome::Error(why) => Verdict::Error(why.clone()),
        RunOutcome::Report {
            aborted: Some(why), ..
        } if writer && is_fixture_change(why) => Verdict::Stopped(why.clone()),
        RunOutcome::Report {
            aborted: Some(why), ..
        } => Verdict::Error(format!("the run was stopped: {why}")),
        RunOutcome::Report {
            passed,
            failed,
            skipped,
            aborted: None,
        } => {
            let (on_its_rules, elsewhere): (Vec<ScenarioRef>, Vec<ScenarioRef>) = failed
                .iter()
                .cloned()
                .partition(|s| !writer && variant.is_caught_by(&s.failed_rules));
            if on_its_rules.is_empty() {
                Verdict::Missed {
                    passed: passed.len(),
                    failed: elsewhere,
                    skipped: skipped.len(),
                }
            } else {
                Verdict::Caught(on_its_rules)
            }
        }
    }
}

/// A legal variant must pass every scenario it runs; a scenario skipped with its reason (one
/// that does not apply to it) is no failure, one the run never finished is.
fn legal_verdict(outcome: &RunOutcome) -> Verdict {
    match outcome {
        RunOutcome::Error(why) => Verdict::Error(why.clone()),
        RunOutcome::Report {
            passed,
            failed,
            skipped,
            aborted,
        } => {
            let mut problems = Vec::new();
            if let Some(why) = aborted {
                problems.push(format!("the run was stopped: {why}"));
            }
            problems.extend(scenario_problems(failed, skipped).map(|(_, problem)| problem));
            if passed.is_empty() {
                problems.push("no scenario passed".to_owned());
            }
            if problems.is_empty() {
                Verdict::Passed {
                    passed: passed.len(),
                    skipped: skipped.len(),
                }
            } else {
                Verdict::FalselyFailed(problem_list(problems))
            }
        }
    }
}

/// The scenarios a legal operator's run failed or did not finish (a skip with its reason is
/// neither), each with what it tells.
fn scenario_problems<'a>(
    failed: &'a [ScenarioRef],
    skipped: &'a [ScenarioRef],
) -> impl Iterator<Item = (&'a ScenarioRef, String)> {
    let failed = failed.iter().map(|scenario| {
        let rules = if scenario.failed_rules.is_empty() {
            "no rule".to_owned()
        } else {
            scenario.failed_rules.join(", ")
        };
        let reason = scenario.reason.as_deref().unwrap_or("no reason recorded");
        (scenario, format!("{scenario} failed on {rules}: {reason}"))
    });
    let unfinished = skipped
        .iter()
        .filter(|s| {
            s.reason.as_deref().is_none_or(|r| {
                r.starts_with(crate::selection::NOT_STARTED) || r.starts_with("not finished")
            })
        })
        .map(|scenario| (scenario, format!("{scenario} did not finish")));
    failed.chain(unfinished)
}

/// Problems as one line, the first few of them.
fn problem_list(mut problems: Vec<String>) -> String {
    const SHOWN: usize = 3;
    if problems.len() > SHOWN {
        let more = problems.len() - SHOWN;
        problems.truncate(SHOWN);
        problems.push(format!("(+{more} more; see the run's report)"));
    }
    problems.join("; ")
}

/// Why a run that must pass every selected scenario (the unbroken operator, which backs the
/// verdicts; a control-plane writer under read-only access) does not, if it does not. A scenario
/// that does not apply to it (a fault on the coderd route it does not use, D-12) is no problem:
/// it backs no catch either (see [`unbacked_catches`]).
pub fn unclean_run_problem(outcome: &RunOutcome) -> Option<String> {
    match outcome {
        RunOutcome::Error(why) => Some(format!("the run failed: {why}")),
        RunOutcome::Report {
            passed,
            failed,
            skipped,
            aborted,
        } => {
            let mut problems = Vec::new();
            if let Some(why) = aborted {
                problems.push(format!("the run was stopped: {why}"));
            }
            if passed.is_empty() {
                problems.push("no scenario passed".to_owned());
            }
            let with_reason = |verb: &str, s: &ScenarioRef| {
                let reason = s.reason.as_deref().unwrap_or("no reason recorded");
                format!("{verb} {s}: {reason}")
            };
            problems.extend(failed.iter().map(|s| with_reason("failed", s)));
            let not_applying = |s: &&ScenarioRef| {
                s.reason
                    .as_deref()
                    .is_some_and(|r| r.starts_with(crate::report::not_applicable::DOES_NOT_APPLY))
            };
            problems.extend(
                skipped
                    .iter()
                    .filter(|s| !not_applying(s))
                    .map(|s| with_reason("skipped", s)),
            );
            (!problems.is_empty()).then(|| problems.join("; "))
        }
    }
}

// ---- the scratch copy ----

/// The operator's binary name in the scratch copy: built into the workspace's target directory,
/// it must not replace the reference binary there.
const VARIANT_BINARY: &str = "coder-provisioner-operator-variant";

/// The operator's package name in a scratch copy at `dir`. Cargo names a workspace member's
/// artifacts after its package, not its path: under the reference's name a variant's library
/// would overwrite the reference's in the shared target directory (and a later build of the
/// reference could link the variant's code); under one name for every copy, a copy elsewhere
/// (another `--out-dir`) would find the last copy's artifacts fresh, because cargo checks the
/// source files recorded for them, which are the other copy's. Its library keeps the crate name
/// `operator`.
fn variant_package(dir: &Path) -> String {
    use std::hash::{Hash as _, Hasher as _};
    // SipHash with fixed keys: the same folder gives the same name in every run.
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    dir.hash(&mut hasher);
    format!("operator-seeded-{:016x}", hasher.finish())
}

/// One copy of the workspace (without `target/` and `.git`), a git repository of its own so
/// that each variant starts from the same tree (`git reset --hard` rewrites only the files the
/// last patch changed, so cargo's incremental build reuses the rest).
struct Scratch {
    dir: PathBuf,
    /// The workspace's target directory, shared with the copy.
    target_dir: PathBuf,
    /// Variants' binaries built before from the same inputs; `None` with `--rebuild`.
    binary_cache: Option<binary_cache::BinaryCache>,
}

/// How a variant is built beside a plain `cargo build`: without debug information or symbols
/// (38 MB instead of 69, a little less to link; panics still print their message). Only the
/// variant's own crate is affected: the dependencies are built without them already.
const VARIANT_BUILD_SETTINGS: [(&str, &str); 2] = [
    ("CARGO_PROFILE_DEV_DEBUG", "0"),
    ("CARGO_PROFILE_DEV_STRIP", "symbols"),
];

impl Scratch {
    async fn create(repo: &Path, dir: &Path, keep_binaries: bool) -> anyhow::Result<Self> {
        if dir.exists() {
            std::fs::remove_dir_all(dir).with_context(|| format!("clearing {}", dir.display()))?;
        }
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut inputs = binary_cache::BuildInputs::default();
        for relative in workspace_files(repo).await? {
            let (from, to) = (repo.join(&relative), dir.join(&relative));
            if !from.is_file() {
                continue; // deleted in the working tree
            }
            if let Some(parent) = to.parent() {
                std::fs::create_dir_all(parent)?;
            }
            if binary_cache::is_build_input(&relative) {
                let contents =
                    std::fs::read(&from).with_context(|| format!("reading {}", from.display()))?;
                inputs.add(&relative, &contents);
            }
            std::fs::copy(&from, &to)
                .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
        }
        // The package and the binary under other names (see variant_package, VARIANT_BINARY),
        // in the manifest and in the lock file, so that `--locked` still holds.
        let package = variant_package(dir);
        rename_in(
            &dir.join("operator/Cargo.toml"),
            &[
                ("name = \"operator\"\n", &format!("name = \"{package}\"\n")),
                (
                    &format!("name = \"{REFERENCE_BINARY}\""),
                    &format!("name = \"{VARIANT_BINARY}\""),
                ),
                (
                    "\n[[bin]]",
                    "\n[lib]\nname = \"operator\"\npath = \"src/lib.rs\"\n\n[[bin]]",
                ),
            ],
        )?;
        rename_in(
            &dir.join("Cargo.lock"),
            &[(
                "\nname = \"operator\"\n",
                &format!("\nname = \"{package}\"\n"),
            )],
        )?;
        let target_dir = match std::env::var_os("CARGO_TARGET_DIR") {
            Some(dir) => std::path::absolute(PathBuf::from(dir))?,
            None => repo.join("target"),
        };
        let binary_cache = match keep_binaries {
            true => Some(binary_cache::BinaryCache::new(
                crate::paths::cache_dir().join("seeded-operators"),
                inputs,
                &toolchain().await?,
                &format!("{VARIANT_BUILD_SETTINGS:?} {:?}", build_environment()),
            )),
            false => None,
        };
        let scratch = Self {
            dir: dir.to_path_buf(),
            target_dir,
            binary_cache,
        };
        scratch.git(&["init", "-q"]).await?;
        scratch.git(&["add", "-A"]).await?;
        scratch
            .git(&[
                "-c",
                "user.name=conformance seeded-bugs",
                "-c",
                "user.email=seeded-bugs@localhost",
                "commit",
                "-q",
                "--no-gpg-sign",
                "--no-verify",
                "-m",
                "the workspace as the patches find it",
            ])
            .await?;
        Ok(scratch)
    }

    /// The legal `variants` grouped into stacks, in order: each joins the first stack whose
    /// header agrees ([`Stack::may_take`]) and on whose changes its diff applies.
    async fn stacks(&self, variants: &[Variant]) -> anyhow::Result<Vec<Stack>> {
        self.git(&["reset", "-q", "--hard"]).await?;
        self.git(&["clean", "-q", "-fd"]).await?;
        let check = self.dir.join("stack-check.patch");
        let mut stacks: Vec<Stack> = Vec::new();
        for variant in variants {
            let mut joined = false;
            for (index, stack) in stacks.iter_mut().enumerate() {
                if !stack.may_take(variant) {
                    continue;
                }
                let candidate = stack.with(variant, index + 1);
                std::fs::write(&check, &candidate.combined.patch)?;
                let applies = !candidate.combined.has_diff
                    || self
                        .git(&[
                            "apply",
                            "--check",
                            "--whitespace=nowarn",
                            &check.display().to_string(),
                        ])
                        .await
                        .is_ok();
                if applies {
                    *stack = candidate;
                    joined = true;
                    break;
                }
            }
            if !joined {
                stacks.push(Stack::alone(variant));
            }
        }
        std::fs::remove_file(&check).ok();
        Ok(stacks)
    }

    /// `git <args>` in the copy; its output, or an error with its stderr.
    async fn git(&self, args: &[&str]) -> anyhow::Result<String> {
        git(&self.dir, args).await
    }

    /// Builds `variant` in the copy; its binary and manifests end up in `dir`.
    async fn prepare(
        &self,
        variant: &Variant,
        reference: &Path,
        dir: &Path,
    ) -> Result<Prepared, String> {
        self.try_prepare(variant, reference, dir)
            .await
            .map_err(|error| format!("{error:#}").trim().replace('\n', " / "))
    }

    async fn try_prepare(
        &self,
        variant: &Variant,
        reference: &Path,
        dir: &Path,
    ) -> anyhow::Result<Prepared> {
        if dir.exists() {
            std::fs::remove_dir_all(dir).with_context(|| format!("clearing {}", dir.display()))?;
        }
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        if !variant.has_diff {
            // A legal variant that changes only how the reference operator is started.
            return Ok(Prepared {
                operator: reference.to_path_buf(),
                cached: false,
                rbac: None,
                crds: None,
            });
        }
        self.git(&["reset", "-q", "--hard"]).await?;
        self.git(&["clean", "-q", "-fd"]).await?;
        let patch = dir.join(format!("{}.patch", variant.name));
        std::fs::write(&patch, &variant.patch)?;
        let patch_arg = patch.display().to_string();
        if let Err(error) = self
            .git(&["apply", "--whitespace=nowarn", &patch_arg])
            .await
        {
            bail!(
                "the patch {} does not apply to this tree: {error:#}",
                variant.origin
            );
        }
        let changed = self.git(&["status", "--porcelain", "--no-renames"]).await?;
        let changed: Vec<&str> = changed
            .lines()
            .filter_map(|line| line.get(3..))
            .map(|path| path.trim_matches('"'))
            .collect();
        let copy_dir = |folder: &str| -> anyhow::Result<Option<PathBuf>> {
            if !changed
                .iter()
                .any(|path| path.starts_with(&format!("{folder}/")))
            {
                return Ok(None);
            }
            let to = dir.join(Path::new(folder).file_name().unwrap_or_default());
            copy_folder(&self.dir.join(folder), &to)?;
            Ok(Some(to))
        };
        let rbac = copy_dir("config/rbac")?;
        let crds = copy_dir("config/crd")?;
        let builds = changed
            .iter()
            .any(|path| !path.starts_with("config/") && !path.starts_with("features/"));
        let (operator, cached) = if builds {
            self.build(variant, dir).await?
        } else {
            (reference.to_path_buf(), false)
        };
        Ok(Prepared {
            operator,
            cached,
            rbac,
            crds,
        })
    }

    /// `cargo build` of the operator in the copy, unless the cache has its binary; the binary
    /// is put into `dir`, and whether it came from the cache.
    async fn build(&self, variant: &Variant, dir: &Path) -> anyhow::Result<(PathBuf, bool)> {
        let copy = dir.join(REFERENCE_BINARY);
        let key = self
            .binary_cache
            .as_ref()
            .map(|cache| cache.key(&variant.patch));
        if let (Some(cache), Some(key)) = (&self.binary_cache, &key)
            && cache.fetch(key, &copy)
        {
            return Ok((copy, true));
        }
        let mut command = crate::implementation::workspace_cargo(
            &self.dir,
            &[
                "build",
                "-p",
                &variant_package(&self.dir),
                "--bin",
                VARIANT_BINARY,
                "--message-format=json-render-diagnostics",
                "--locked",
            ],
        );
        for (name, value) in VARIANT_BUILD_SETTINGS {
            command.env(name, value);
        }
        let output = command
            .env("CARGO_TARGET_DIR", &self.target_dir)
            .output()
            .await
            .context("running cargo")?;
        // The compiler's messages, rendered by cargo.
        let log_path = dir.join("build.log");
        std::fs::write(&log_path, &output.stderr)
            .with_context(|| format!("writing {}", log_path.display()))?;
        if !output.status.success() {
            let text = String::from_utf8_lossy(&output.stderr);
            let errors: Vec<&str> = text
                .lines()
                .filter(|line| line.starts_with("error"))
                .take(3)
                .collect();
            bail!(
                "the patch {} does not compile ({}): {}; see {}",
                variant.origin,
                output.status,
                errors.join(" / "),
                log_path.display()
            );
        }
        let built = crate::implementation::built_executable_named(
            &String::from_utf8_lossy(&output.stdout),
            VARIANT_BINARY,
        )
        .ok_or_else(|| anyhow!("cargo reported no {VARIANT_BINARY} executable"))?;
        std::fs::copy(&built, &copy)
            .with_context(|| format!("copying {} to {}", built.display(), copy.display()))?;
        if let (Some(cache), Some(key)) = (&self.binary_cache, &key)
            && let Err(error) = cache.store(key, &copy)
        {
            eprintln!(
                "seeded-bugs: could not keep {}'s binary: {error:#}",
                variant.name
            );
        }
        Ok((copy, false))
    }
}

/// `rustc -vV`: the toolchain that builds the variants (part of their binaries' cache key).
async fn toolchain() -> anyhow::Result<String> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let output = tokio::process::Command::new(&rustc)
        .arg("-vV")
        .stdin(Stdio::null())
        .output()
        .await
        .context("running rustc -vV")?;
    if !output.status.success() {
        bail!("rustc -vV failed ({})", output.status);
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The settings cargo and rustc take from this process's environment (compiler flags, profile
/// and build settings): they change what a build makes. Sorted, so that the key does not
/// depend on the environment's order.
fn build_environment() -> Vec<(String, String)> {
    let mut settings: Vec<(String, String)> = std::env::vars()
        .filter(|(name, _)| {
            [
                "RUSTFLAGS",
                "CARGO_ENCODED_RUSTFLAGS",
                "RUSTC_WRAPPER",
                "RUSTC_BOOTSTRAP",
            ]
            .contains(&name.as_str())
                || name.starts_with("CARGO_PROFILE_")
                || name.starts_with("CARGO_BUILD_")
        })
        .collect();
    settings.sort();
    settings
}

/// Replaces the first occurrence of each `(from, to)` in the file at `path`; fails when one is
/// missing (the workspace no longer looks as the runner expects).
fn rename_in(path: &Path, replacements: &[(&str, &str)]) -> anyhow::Result<()> {
    let mut text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    for (from, to) in replacements {
        if !text.contains(from) {
            bail!("{} holds no {from:?}", path.display());
        }
        text = text.replacen(from, to, 1);
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// `git <args>` in `dir`: its stdout, or an error with its stderr.
async fn git(dir: &Path, args: &[&str]) -> anyhow::Result<String> {
    let output = tokio::process::Command::new("git")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .await
        .context("running git")?;
    if !output.status.success() {
        bail!(
            "git {} failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The workspace's files as the working tree has them (tracked and untracked, not ignored),
/// relative to `repo`.
async fn workspace_files(repo: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let listed = git(
        repo,
        &[
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ],
    )
    .await
    .context("listing the workspace's files (the seeded variants need its git checkout)")?;
    let files: BTreeSet<PathBuf> = listed
        .split('\0')
        .filter(|path| !path.is_empty())
        .map(PathBuf::from)
        .collect();
    Ok(files.into_iter().collect())
}

/// Copies the files of `from` (one level) into a fresh `to`.
fn copy_folder(from: &Path, to: &Path) -> anyhow::Result<()> {
    if to.exists() {
        std::fs::remove_dir_all(to)?;
    }
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let path = entry?.path();
        if path.is_file() {
            std::fs::copy(&path, to.join(path.file_name().unwrap_or_default()))?;
        }
    }
    Ok(())
}

// ---- running the suite ----

/// Runs the suite once against `operator`; its output goes to `suite.log` in the run's report
/// folder.
async fn run_suite(
    args: &SeededArgs,
    suite_bin: &Path,
    features: &Path,
    run: &PlannedRun,
    prepared: &Prepared,
) -> RunOutcome {
    match try_run_suite(args, suite_bin, features, run, prepared).await {
        Ok(outcome) => outcome,
        Err(error) => RunOutcome::Error(format!("{error:#}")),
    }
}

async fn try_run_suite(
    args: &SeededArgs,
    suite_bin: &Path,
    features: &Path,
    run: &PlannedRun,
    prepared: &Prepared,
) -> anyhow::Result<RunOutcome> {
    if run.report_dir.exists() {
        std::fs::remove_dir_all(&run.report_dir)
            .with_context(|| format!("clearing {}", run.report_dir.display()))?;
    }
    std::fs::create_dir_all(&run.report_dir)
        .with_context(|| format!("creating {}", run.report_dir.display()))?;
    let log_path = run.report_dir.join("suite.log");
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    let mut command = tokio::process::Command::new(suite_bin);
    command.arg("run").args(["--cluster", "local"]);
    if !run.tags.is_empty() {
        command.args(["--tags", &run.tags]);
    }
    if let Some(name) = &run.name {
        command.args(["--name", name]);
    }
    if run.fail_fast {
        command.arg("--fail-fast");
    }
    command
        .arg("--report-dir")
        .arg(&run.report_dir)
        .arg("--features")
        .arg(features)
        .args(["--concurrency", &args.concurrency.to_string()])
        // `--jobs` runs share the machine: one private environment each for their @serial
        // scenarios (a control plane more per run, not two).
        .args(["--private-environments", "1"])
        // A verdict needs the failure, not its smallest case.
        .args(["--shrink-seconds", "0"])
        .args([
            "--impl-name",
            &format!("coder-provisioner-operator ({})", run.label()),
        ])
        .env(REFERENCE_BINARY_ENV, &prepared.operator)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    if let Some(scale) = args.timeout_scale {
        command.args(["--timeout-scale", &scale.to_string()]);
    }
    if let Some(rbac) = &prepared.rbac {
        command.arg("--operator-rbac").arg(rbac);
    }
    if let Some(crds) = &prepared.crds {
        command.arg("--crds").arg(crds);
    }
    if run.read_only {
        command.args(["--control-plane-access", "read-only"]);
    }
    if let Some(variant) = &run.variant {
        let operator = shell_quoted(&prepared.operator.display().to_string());
        for (flag, line) in [
            ("--operator-cmd", &variant.operator_cmd),
            ("--replica-cmd", &variant.replica_cmd),
        ] {
            if let Some(line) = line {
                command.args([flag, &line.replace("{operator}", &operator)]);
            }
        }
    }
    let status = command
        .status()
        .await
        .with_context(|| format!("starting {}", suite_bin.display()))?;
    let report_path = run.report_dir.join(crate::paths::REPORT_FILE);
    let Ok(text) = std::fs::read_to_string(&report_path) else {
        bail!(
            "the suite exited with {status} without a report; see {}",
            log_path.display()
        );
    };
    Ok(outcome_of(&ConformanceReport::from_yaml(&text)?))
}

/// The run to try after `run` when it did not catch its variant, and why: the scenarios that
/// caught it last time did not, so all its scenarios run (still stopping at the first failure);
/// or a run stopped at its first failure, which was on other rules, so only the whole selection
/// can tell whether a later scenario catches it.
fn next_attempt(run: &PlannedRun, outcome: &RunOutcome) -> Option<(PlannedRun, &'static str)> {
    let variant = run.variant.as_ref()?;
    let verdict = verdict(variant, outcome);
    if run.recorded_catches && !matches!(verdict, Verdict::Caught(_)) {
        let all = PlannedRun {
            name: None,
            recorded_catches: false,
            ..run.clone()
        };
        return Some((
            all,
            "was not caught by the scenarios that caught it last time; running all its scenarios",
        ));
    }
    let failed_elsewhere =
        matches!(outcome, RunOutcome::Report { failed, aborted: None, .. } if !failed.is_empty());
    (run.fail_fast && failed_elsewhere && matches!(verdict, Verdict::Missed { .. })).then(|| {
        let full = PlannedRun {
            fail_fast: false,
            ..run.clone()
        };
        (
            full,
            "failed first on other rules; running all its scenarios",
        )
    })
}

/// `word` as one word of a `sh -c` line.
fn shell_quoted(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

fn repo_root() -> anyhow::Result<PathBuf> {
    crate::paths::repo_root()
        .canonicalize()
        .context("locating the repository root")
}

/// The variants to run: the `--patch` files, else the built-in ones; `--only` picks by name.
fn selected_variants(
    patches: &[PathBuf],
    only: &[String],
    legal: bool,
) -> anyhow::Result<Vec<Variant>> {
    let all: Vec<Variant> = if patches.is_empty() && legal {
        legal_variants().to_vec()
    } else if patches.is_empty() {
        variants().to_vec()
    } else {
        patches
            .iter()
            .map(|path| Variant::read(path))
            .collect::<anyhow::Result<_>>()?
    };
    let mut names = BTreeSet::new();
    if let Some(twice) = all.iter().find(|v| !names.insert(v.name.as_str())) {
        bail!(
            "two patches are named {} ({}); names must be unique",
            twice.name,
            twice.origin
        );
    }
    if only.is_empty() {
        return Ok(all);
    }
    only.iter()
        .map(|name| {
            all.iter()
                .find(|v| &v.name == name)
                .cloned()
                .ok_or_else(|| {
                    anyhow!(
                        "unknown variant {name:?}; known: {}",
                        all.iter()
                            .map(|v| v.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                })
        })
        .collect()
}

/// The variant table as text (`--list`, and the list in docs/seeded-bugs.md).
pub fn variant_list(variants: &[Variant]) -> String {
    let width = variants.iter().map(|v| v.name.len()).max().unwrap_or(0);
    let mut text = String::new();
    for variant in variants {
        let what = match variant.breakage {
            Breakage::ControlPlaneWriter => format!(
                "breaks the suite's control-plane fixture (runs {})",
                variant.tag_expression()
            ),
            Breakage::Rules => match &variant.scenarios {
                None => format!("breaks {}", variant.breaks.join(", ")),
                Some(tags) => format!("breaks {} (runs {tags})", variant.breaks.join(", ")),
            },
            Breakage::Legal => match &variant.scenarios {
                None => format!(
                    "permitted by {} (runs every scenario)",
                    variant.permits.join(", ")
                ),
                Some(tags) => format!("permitted by {} (runs {tags})", variant.permits.join(", ")),
            },
        };
        let _ = writeln!(text, "{:width$}  {what}", variant.name);
    }
    text
}

/// Runs every selected variant and the unbroken operator; prints the table.
pub async fn run(args: SeededArgs) -> anyhow::Result<ExitCode> {
    let variants = selected_variants(&args.patches, &args.only, args.legal)?;
    if args.list {
        print!("{}", variant_list(&variants));
        return Ok(ExitCode::SUCCESS);
    }
    let started = Instant::now();
    let repo = repo_root()?;
    let out_dir = args
        .out_dir
        .clone()
        .unwrap_or_else(|| repo.join("target/seeded-bugs"));
    std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let out_dir = out_dir.canonicalize()?;
    let suite_bin = match &args.suite_bin {
        Some(path) => path.clone(),
        None => std::env::current_exe().context("locating this executable")?,
    };
    let reference_operator = match &args.reference_operator {
        Some(path) => path.clone(),
        None => reference_operator_binary().await?,
    };
    let reference = Prepared {
        operator: reference_operator.clone(),
        cached: false,
        rbac: None,
        crds: None,
    };
    eprintln!(
        "seeded-bugs: copying the workspace into {}",
        out_dir.join("tree").display()
    );
    let scratch = Scratch::create(&repo, &out_dir.join("tree"), !args.rebuild).await?;
    let stacks = if !args.alone && variants.iter().all(Variant::is_legal) {
        scratch.stacks(&variants).await?
    } else {
        variants.iter().map(Stack::alone).collect()
    };
    for stack in stacks.iter().filter(|s| s.members.len() > 1) {
        eprintln!(
            "seeded-bugs: {} = {} (one operator with every change; {})",
            stack.combined.name,
            stack
                .members
                .iter()
                .map(|v| v.name.as_str())
                .collect::<Vec<_>>()
                .join(" + "),
            stack
                .combined
                .scenarios
                .as_deref()
                .unwrap_or("every scenario")
        );
    }
    let features = match &args.features {
        Some(folder) => folder.clone(),
        None => scratch.dir.join("features"),
    };
    let runner = Runner {
        args: &args,
        scratch: &scratch,
        suite_bin: &suite_bin,
        features: &features,
        reference: &reference,
        out_dir: &out_dir,
        took: Default::default(),
        cached_builds: Default::default(),
    };
    let mut runnable: Vec<Variant> = stacks.iter().map(|s| s.combined.clone()).collect();

    // The unbroken operator backs the catches: legal variants need no such run.
    let seeded: Vec<&Variant> = runnable.iter().filter(|v| !v.is_legal()).collect();
    let unbroken_runs = if seeded.is_empty() {
        0
    } else {
        args.unbroken_runs as usize
    };
    let union = {
        let mut expressions: Vec<String> = seeded
            .iter()
            .map(|v| format!("({})", v.tag_expression()))
            .collect();
        expressions.sort_unstable();
        expressions.dedup();
        expressions.join(" or ")
    };
    let recorded = if args.every_scenario || !args.patches.is_empty() {
        catches::Catches::new()
    } else {
        catches::recorded()
    };
    let recorded_for = |variant: &Variant| {
        let caught_before = !variant.is_legal() && variant.breakage != Breakage::ControlPlaneWriter;
        caught_before
            .then(|| recorded.get(&variant.name))
            .flatten()
            .map(|catch| Stack::name_regex(catch.scenarios.iter().map(String::as_str)))
    };
    // Where every variant has a record, the unbroken operator runs on the recorded scenarios;
    // it runs again on any other scenario that catches a variant (see unbacked_catches).
    let unbroken_names = seeded
        .iter()
        .all(|v| v.breakage == Breakage::ControlPlaneWriter || recorded_for(v).is_some())
        .then(|| {
            Stack::name_regex(
                seeded
                    .iter()
                    .filter_map(|v| recorded.get(&v.name))
                    .flat_map(|catch| &catch.scenarios)
                    .map(String::as_str),
            )
        });
    // The longest runs first, so that they do not end the stage alone; a variant without a
    // record first of all (it runs every scenario of its rules).
    runnable.sort_by_key(|v| {
        std::cmp::Reverse(
            recorded
                .get(&v.name)
                .map_or(u64::MAX, |catch| catch.seconds),
        )
    });
    let reports = out_dir.join("reports");
    let mut runs: Vec<PlannedRun> = (1..=unbroken_runs)
        .map(|round| PlannedRun {
            variant: None,
            round,
            read_only: false,
            tags: union.clone(),
            name: unbroken_names.clone(),
            recorded_catches: false,
            fail_fast: false,
            report_dir: reports.join(format!("unbroken-operator-{round}")),
        })
        .collect();
    for variant in &runnable {
        let name = recorded_for(variant);
        let run = PlannedRun {
            variant: Some(variant.clone()),
            round: 1,
            read_only: false,
            tags: variant.tag_expression(),
            recorded_catches: name.is_some(),
            name,
            fail_fast: !variant.is_legal() && variant.breakage != Breakage::ControlPlaneWriter,
            report_dir: reports.join(&variant.name),
        };
        runs.push(run.clone());
        if variant.breakage == Breakage::ControlPlaneWriter {
            runs.push(PlannedRun {
                read_only: true,
                fail_fast: false,
                name: None,
                recorded_catches: false,
                report_dir: reports.join(format!("{}-read-only", variant.name)),
                ..run
            });
        }
    }
    eprintln!(
        "seeded-bugs: {} variants{}, the unbroken operator {} and {} read-only control-plane access check(s), up to {} suite runs at a time (past two only while the CPUs have room); logs and reports in {}",
        variants.len(),
        if runnable.len() < variants.len() {
            format!(" in {} runs", runnable.len())
        } else {
            String::new()
        },
        match unbroken_runs {
            0 => "not at all (legal variants only)".to_owned(),
            1 => "once".to_owned(),
            2 => "twice".to_owned(),
            n => format!("{n} times"),
        },
        runs.iter().filter(|run| run.read_only).count(),
        args.jobs.max(1),
        reports.display()
    );
    crate::load::start_sampling();
    let results = runner.build_and_run(&runnable, runs).await;
    let mut verdicts = Vec::new();
    let mut failed_stacks = Vec::new();
    for (run, outcome) in results.iter().filter(|(run, _)| !run.read_only) {
        let Some(variant) = &run.variant else {
            continue;
        };
        let verdict = verdict(variant, outcome);
        match stacks.iter().find(|s| s.combined.name == variant.name) {
            Some(stack) if stack.members.len() > 1 => match verdict {
                Verdict::FalselyFailed(_) => failed_stacks.push((stack, outcome)),
                // Passed, or an error (the changes do not build together): the same for each.
                _ => verdicts.extend(stack.members.iter().map(|m| (m.clone(), verdict.clone()))),
            },
            _ => verdicts.push((variant.clone(), verdict)),
        }
    }
    let (alone, stack_only) = runner.members_alone(failed_stacks).await;
    verdicts.extend(alone);
    let mut results = results;
    if unbroken_names.is_some() && unbroken_runs > 0 {
        let unbacked = unbacked_catches(&verdicts, &results);
        if !unbacked.is_empty() {
            eprintln!(
                "seeded-bugs: {} scenario(s) caught a variant outside the unbroken operator's run; it runs on them too",
                unbacked.len()
            );
            let run = PlannedRun {
                variant: None,
                round: unbroken_runs + 1,
                read_only: false,
                tags: union.clone(),
                name: Some(Stack::name_regex(unbacked.iter().map(String::as_str))),
                recorded_catches: false,
                fail_fast: false,
                report_dir: reports.join("unbroken-operator-other-catches"),
            };
            results.extend(runner.build_and_run(&[], vec![run]).await);
        }
    }
    if args.write_catches {
        let took = runner.took.lock().expect("not poisoned");
        let caught: catches::Catches = verdicts
            .iter()
            .filter_map(|(variant, verdict)| match verdict {
                Verdict::Caught(scenarios) if variant.origin.starts_with(PATCH_DIR) => Some((
                    variant.name.clone(),
                    catches::Catch {
                        seconds: took.get(&variant.name).copied().unwrap_or_default(),
                        scenarios: scenarios.iter().map(|s| s.name.clone()).collect(),
                    },
                )),
                _ => None,
            })
            .collect();
        let known: Vec<&str> = self::variants().iter().map(|v| v.name.as_str()).collect();
        catches::write(&repo, &caught, &known)?;
        eprintln!(
            "seeded-bugs: recorded the catches of {} variant(s) in {}",
            caught.len(),
            catches::FILE
        );
    }
    let position = |name: &str| {
        variants
            .iter()
            .position(|v| v.name == name)
            .unwrap_or(usize::MAX)
    };
    verdicts.sort_by_key(|(variant, _)| position(&variant.name));
    print!("{}", table(&verdicts));
    for failure in &stack_only {
        println!(
            "{failure}: FALSE only together (each member passes alone where the stack failed): {}",
            failure.problems
        );
    }
    let (legal, broken): (Vec<_>, Vec<_>) = verdicts.iter().partition(|(v, _)| v.is_legal());
    let caught = broken
        .iter()
        .filter(|(_, v)| matches!(v, Verdict::Caught(_) | Verdict::Stopped(_)))
        .count();
    if !broken.is_empty() {
        println!("caught {caught} of {}", broken.len());
        let runs = results
            .iter()
            .filter(|(run, _)| !run.read_only)
            .filter_map(|(run, outcome)| Some((run.variant.as_ref()?, outcome)));
        print!("{}", BlamePrecision::of(runs));
    }
    let legal_passed = legal
        .iter()
        .filter(|(_, v)| matches!(v, Verdict::Passed { .. }))
        .count();
    if !legal.is_empty() {
        println!("{}", stack::legal_summary(&legal, &stack_only));
    }
    let mut all_clean = true;
    let must_pass = results
        .iter()
        .filter(|(run, _)| run.variant.is_none() || run.read_only);
    for (run, outcome) in must_pass {
        let problem = unclean_run_problem(outcome);
        all_clean &= problem.is_none();
        match (problem, outcome) {
            (
                None,
                RunOutcome::Report {
                    passed, skipped, ..
                },
            ) => {
                println!(
                    "{}: all {} selected scenarios passed{}",
                    run.label(),
                    passed.len(),
                    match skipped.len() {
                        0 => String::new(),
                        n => format!(" ({n} more do not apply to it, D-12)"),
                    }
                )
            }
            (Some(problem), _) if run.variant.is_none() => println!(
                "{}: NOT CLEAN, so the catches prove nothing: {problem}",
                run.label()
            ),
            (Some(problem), _) => println!(
                "{}: NOT CLEAN, so read-only access does not neutralise it: {problem}",
                run.label()
            ),
            (None, RunOutcome::Error(_)) => {}
        }
    }
    if let Some(cache) = &scratch.binary_cache {
        let cached = runner
            .cached_builds
            .load(std::sync::atomic::Ordering::Relaxed);
        println!(
            "variant binaries: {cached} taken from the cache (--rebuild builds every one); {} unused ones removed from it",
            cache.prune()
        );
    }
    println!(
        "took {}s; reports in {}",
        started.elapsed().as_secs(),
        reports.display()
    );
    Ok(
        if caught == broken.len()
            && legal_passed == legal.len()
            && stack_only.is_empty()
            && all_clean
        {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        },
    )
}

/// What every suite run of one `seeded-bugs` invocation shares.
struct Runner<'a> {
    args: &'a SeededArgs,
    scratch: &'a Scratch,
    suite_bin: &'a Path,
    /// The feature files every run reads.
    features: &'a Path,
    reference: &'a Prepared,
    out_dir: &'a Path,
    /// Each variant's wall time, all its attempts together, in seconds.
    took: std::sync::Mutex<BTreeMap<String, u64>>,
    /// Variants whose binary came from the cache.
    cached_builds: std::sync::atomic::AtomicUsize,
}

impl Runner<'_> {
    /// Builds `variants` one after another (each in `variants/<name>`) while the `runs` whose
    /// variant is built go ahead, `--jobs` at a time; the outcomes in the order of `variants`.
    async fn build_and_run(
        &self,
        variants: &[Variant],
        runs: Vec<PlannedRun>,
    ) -> Vec<(PlannedRun, RunOutcome)> {
        let mut senders = Vec::new();
        let mut prepared: Vec<PreparedFuture> = Vec::new();
        for _ in variants {
            let (tx, rx) = futures::channel::oneshot::channel::<Result<Prepared, String>>();
            senders.push(tx);
            prepared.push(
                rx.map(|built| built.unwrap_or_else(|_| Err("the build was abandoned".to_owned())))
                    .boxed()
                    .shared(),
            );
        }
        let builds = async {
            for (variant, tx) in variants.iter().zip(senders) {
                let clock = Instant::now();
                let dir = self.out_dir.join("variants").join(&variant.name);
                let result = self
                    .scratch
                    .prepare(variant, &self.reference.operator, &dir)
                    .await;
                match &result {
                    Ok(prepared) if prepared.cached => {
                        self.cached_builds
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        eprintln!(
                            "seeded-bugs: {}'s binary from the cache (built before from the same sources, toolchain and patch)",
                            variant.name
                        );
                    }
                    _ => eprintln!(
                        "seeded-bugs: built {} in {}s{}",
                        variant.name,
                        clock.elapsed().as_secs(),
                        match &result {
                            Ok(_) => String::new(),
                            Err(why) => format!(": ERROR {why}"),
                        }
                    ),
                }
                let _receiver_gone = tx.send(result);
            }
        };
        let position = |run: &PlannedRun| {
            run.variant
                .as_ref()
                .and_then(|v| variants.iter().position(|known| known.name == v.name))
        };
        // A variant's binary (about 70 MB) is removed after its last run: a hundred of them
        // would fill the disk of a CI machine (`--only NAME` builds one again).
        let runs_left: Vec<std::sync::atomic::AtomicUsize> = (0..variants.len())
            .map(|index| {
                let of_variant = runs
                    .iter()
                    .filter(|run| position(run) == Some(index))
                    .count();
                std::sync::atomic::AtomicUsize::new(of_variant)
            })
            .collect();
        let runs_left = &runs_left;
        let total = runs.len();
        let mut finished = 0;
        let running = &std::sync::atomic::AtomicUsize::new(0);
        let suites = futures::stream::iter(runs)
            .map(|run| {
                let index = position(&run);
                let built = index.map(|index| prepared[index].clone());
                let binary = built.clone();
                async move {
                    let ready = match built {
                        None => Ok(self.reference.clone()),
                        Some(built) => built.await,
                    };
                    // Up to `--jobs` runs, each a control plane and an operator: the next one
                    // starts only while the CPUs have room (the first two always do).
                    crate::load::room_for_another(
                        || running.load(std::sync::atomic::Ordering::SeqCst),
                        RUNS_ALWAYS_STARTED,
                        crate::load::RUN_START_LIMIT,
                    )
                    .await;
                    running.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let clock = Instant::now();
                    let outcome = match ready {
                        Ok(prepared) => {
                            let mut attempt = run.clone();
                            loop {
                                let outcome = run_suite(
                                    self.args,
                                    self.suite_bin,
                                    self.features,
                                    &attempt,
                                    &prepared,
                                )
                                .await;
                                match next_attempt(&attempt, &outcome) {
                                    Some((next, why)) => {
                                        eprintln!("seeded-bugs: {} {why}", run.label());
                                        attempt = next;
                                    }
                                    None => break outcome,
                                }
                            }
                        }
                        Err(why) => RunOutcome::Error(why),
                    };
                    running.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    if let (Some(index), Some(binary)) = (index, binary)
                        && runs_left[index].fetch_sub(1, std::sync::atomic::Ordering::SeqCst) == 1
                    {
                        self.remove_variant_binary(binary).await;
                    }
                    (run, outcome, clock.elapsed())
                }
            })
            .buffer_unordered(self.args.jobs.max(1))
            .map(|(run, outcome, took)| {
                finished += 1;
                if let (Some(variant), false) = (&run.variant, run.read_only) {
                    let mut all = self.took.lock().expect("not poisoned");
                    all.insert(variant.name.clone(), took.as_secs());
                }
                eprintln!(
                    "seeded-bugs: [{finished}/{total}] {} finished in {}s: {}",
                    run.label(),
                    took.as_secs(),
                    short(&outcome)
                );
                (run, outcome)
            })
            .collect::<Vec<_>>();
        let ((), mut results) = futures::join!(builds, suites);
        results.sort_by_key(|(run, _)| (position(run), run.round, run.read_only));
        results
    }

    /// Removes a variant's own operator binary (not the reference's, which variants that change
    /// only manifests run).
    async fn remove_variant_binary(&self, built: PreparedFuture) {
        if let Ok(prepared) = built.await
            && prepared.operator.starts_with(self.out_dir.join("variants"))
            && let Err(error) = std::fs::remove_file(&prepared.operator)
        {
            eprintln!(
                "seeded-bugs: could not remove {}: {error}",
                prepared.operator.display()
            );
        }
    }

    /// Each member of each failed stack, alone on the scenarios its stack failed (all of the
    /// stack's, when the run names none): the members' verdicts, and the stacks' failures that
    /// no member shows alone (the combination fails, not a change).
    async fn members_alone(
        &self,
        failed_stacks: Vec<(&Stack, &RunOutcome)>,
    ) -> (Vec<(Variant, Verdict)>, Vec<StackOnly>) {
        if failed_stacks.is_empty() {
            return (Vec::new(), Vec::new());
        }
        let mut members = Vec::new();
        let mut runs = Vec::new();
        for (stack, outcome) in &failed_stacks {
            let name = match outcome {
                RunOutcome::Report {
                    failed, skipped, ..
                } if !failed.is_empty() => Some(Stack::name_regex(
                    failed.iter().chain(skipped).map(|s| s.name.as_str()),
                )),
                _ => None,
            };
            eprintln!(
                "seeded-bugs: {} failed; its members run alone on {}",
                stack.combined.name,
                if name.is_some() {
                    "the scenarios it failed"
                } else {
                    "its scenarios"
                }
            );
            for member in &stack.members {
                members.push(member.clone());
                runs.push(PlannedRun {
                    variant: Some(member.clone()),
                    round: 1,
                    read_only: false,
                    tags: member.tag_expression(),
                    name: name.clone(),
                    recorded_catches: false,
                    fail_fast: false,
                    report_dir: self
                        .out_dir
                        .join("reports")
                        .join(format!("{}-alone", member.name)),
                });
            }
        }
        let results = self.build_and_run(&members, runs).await;
        let mut verdicts = Vec::new();
        let mut stack_only = Vec::new();
        for (stack, together) in failed_stacks {
            let alone: Vec<(&Variant, &RunOutcome)> = results
                .iter()
                .filter_map(|(run, outcome)| {
                    let member = run.variant.as_ref()?;
                    stack
                        .members
                        .iter()
                        .any(|m| m.name == member.name)
                        .then_some((member, outcome))
                })
                .collect();
            let outcomes: Vec<&RunOutcome> = alone.iter().map(|(_, outcome)| *outcome).collect();
            stack_only.extend(stack::stack_only(stack, together, &outcomes));
            verdicts.extend(
                alone
                    .into_iter()
                    .map(|(member, outcome)| (member.clone(), legal_verdict(outcome))),
            );
        }
        (verdicts, stack_only)
    }
}

/// Issue 51: how precisely the suite blames. Of the scenarios failed against broken variants,
/// those whose blamed rules all lie in their variant's `# breaks:` or `# consequences:`.
#[derive(Debug, Default, PartialEq)]
pub struct BlamePrecision {
    pub failed: usize,
    /// (variant, scenario, the blamed rules outside its list; empty: it blamed no rule at all).
    pub imprecise: Vec<(String, String, Vec<String>)>,
}

impl BlamePrecision {
    pub fn of<'a>(runs: impl IntoIterator<Item = (&'a Variant, &'a RunOutcome)>) -> Self {
        let mut precision = BlamePrecision::default();
        for (variant, outcome) in runs {
            let RunOutcome::Report { failed, .. } = outcome else {
                continue;
            };
            if variant.is_legal() || variant.breakage == Breakage::ControlPlaneWriter {
                continue;
            }
            for scenario in failed {
                precision.failed += 1;
                let outside: Vec<String> = scenario
                    .failed_rules
                    .iter()
                    .filter(|rule| {
                        !variant.breaks.contains(rule) && !variant.consequences.contains(rule)
                    })
                    .cloned()
                    .collect();
                if !outside.is_empty() || scenario.failed_rules.is_empty() {
                    precision.imprecise.push((
                        variant.name.clone(),
                        format!("{}:{} {}", scenario.feature, scenario.line, scenario.name),
                        outside,
                    ));
                }
            }
        }
        precision
    }
}

impl std::fmt::Display for BlamePrecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let precise = self.failed - self.imprecise.len();
        let share = if self.failed == 0 {
            100.0
        } else {
            100.0 * precise as f64 / self.failed as f64
        };
        writeln!(
            f,
            "blame precision: {precise} of {} failed scenarios ({share:.1} %) blame only their variant's rules (# breaks: or # consequences:)",
            self.failed
        )?;
        for (variant, scenario, outside) in &self.imprecise {
            match outside.as_slice() {
                [] => writeln!(f, "  {variant}: {scenario} blames no rule")?,
                rules => writeln!(f, "  {variant}: {scenario} also blames {}", rules.join(", "))?,
            }
        }
        Ok(())
    }
}

/// The names of the scenarios that caught a variant but that no run of the unbroken operator
/// passed (it ran on other scenarios): without its pass there, the catch proves nothing.
fn unbacked_catches(
    verdicts: &[(Variant, Verdict)],
    results: &[(PlannedRun, RunOutcome)],
) -> std::collections::BTreeSet<String> {
    let backed: std::collections::BTreeSet<&str> = results
        .iter()
        .filter(|(run, _)| run.variant.is_none())
        .flat_map(|(_, outcome)| match outcome {
            RunOutcome::Report { passed, .. } => passed.iter().map(|s| s.name.as_str()).collect(),
            RunOutcome::Error(_) => Vec::new(),
        })
        .collect();
    verdicts
        .iter()
        .flat_map(|(_, verdict)| match verdict {
            Verdict::Caught(scenarios) => scenarios.as_slice(),
            _ => &[],
        })
        .filter(|s| !backed.contains(s.name.as_str()))
        .map(|s| s.name.clone())
        .collect()
}

/// Suite runs that start however busy the CPUs are.
const RUNS_ALWAYS_STARTED: usize = 2;

fn short(outcome: &RunOutcome) -> String {
    match outcome {
        RunOutcome::Report {
            passed,
            failed,
            skipped,
            aborted,
        } => {
            format!(
                "{} passed, {} failed, {} skipped{}",
                passed.len(),
                failed.len(),
                skipped.len(),
                if aborted.is_some() { ", STOPPED" } else { "" }
            )
        }
        RunOutcome::Error(why) => format!("ERROR {why}"),
    }
}

/// variant → scenarios that failed → caught / MISSED / ERROR.
pub fn table(verdicts: &[(Variant, Verdict)]) -> String {
    const SHOWN: usize = 3;
    let listed = |scenarios: &[ScenarioRef]| {
        let mut shown: Vec<String> = scenarios
            .iter()
            .take(SHOWN)
            .map(ToString::to_string)
            .collect();
        if scenarios.len() > SHOWN {
            shown.push(format!("(+{} more)", scenarios.len() - SHOWN));
        }
        shown.join(", ")
    };
    let rows: Vec<[String; 3]> = verdicts
        .iter()
        .map(|(variant, verdict)| {
            let name = variant.name.clone();
            match verdict {
                Verdict::Caught(failed) => [name, listed(failed), "caught".to_owned()],
                // The guard's message is long; its first sentence names the change.
                Verdict::Stopped(message) => [
                    name,
                    format!(
                        "none; the run was stopped: {}",
                        message.split(". ").next().unwrap_or(message)
                    ),
                    "caught".to_owned(),
                ],
                Verdict::Missed {
                    passed: 0,
                    failed,
                    skipped: 0,
                } if failed.is_empty() => [
                    name,
                    "none (no scenario is selected)".to_owned(),
                    "MISSED".to_owned(),
                ],
                Verdict::Missed {
                    passed,
                    failed,
                    skipped,
                } if variant.breakage == Breakage::ControlPlaneWriter => [
                    name,
                    format!(
                        "the fixture guard did not stop the run ({passed} passed, {} failed, {skipped} skipped)",
                        failed.len()
                    ),
                    "MISSED".to_owned(),
                ],
                Verdict::Missed {
                    passed,
                    failed,
                    skipped,
                } if failed.is_empty() => [
                    name,
                    format!("none ({passed} passed, {skipped} skipped)"),
                    "MISSED".to_owned(),
                ],
                Verdict::Missed {
                    passed,
                    failed,
                    skipped,
                } => [
                    name,
                    format!(
                        "none on the rules it breaks ({passed} passed, {skipped} skipped; failed on other rules: {})",
                        listed(failed)
                    ),
                    "MISSED".to_owned(),
                ],
                Verdict::Passed { passed, skipped } => [
                    name,
                    format!("none ({passed} passed, {skipped} skipped with their reason)"),
                    "passed".to_owned(),
                ],
                Verdict::FalselyFailed(problems) => [name, problems.clone(), "FALSE".to_owned()],
                Verdict::Error(why) => [name, why.clone(), "ERROR".to_owned()],
            }
        })
        .collect();
    let width = rows
        .iter()
        .map(|r| r[0].len())
        .max()
        .unwrap_or(0)
        .max("variant".len());
    let mut text = format!("{:width$}  {:7}  failed scenarios\n", "variant", "verdict");
    for [name, failed, verdict] in rows {
        let _ = writeln!(text, "{name:width$}  {verdict:7}  {failed}");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn scenario(line: usize) -> ScenarioRef {
        ScenarioRef {
            feature: "f.feature".into(),
            line,
            name: format!("s{line}"),
            reason: Some(format!("step {line} failed")),
            failed_rules: vec!["R-KEY-4".into()],
        }
    }

    /// Failed on a rule no test variant breaks.
    fn elsewhere(line: usize) -> ScenarioRef {
        ScenarioRef {
            failed_rules: vec!["R-ST-4".into()],
            ..scenario(line)
        }
    }

    fn report(passed: &[usize], failed: &[usize], skipped: &[usize]) -> RunOutcome {
        let refs = |lines: &[usize]| lines.iter().copied().map(scenario).collect();
        RunOutcome::Report {
            passed: refs(passed),
            failed: refs(failed),
            skipped: refs(skipped),
            aborted: None,
        }
    }

    /// `outcome` with its skipped scenarios not applying to the implementation (D-12).
    fn not_applying(outcome: RunOutcome) -> RunOutcome {
        match outcome {
            RunOutcome::Report {
                passed,
                failed,
                skipped,
                aborted,
            } => RunOutcome::Report {
                passed,
                failed,
                skipped: skipped
                    .into_iter()
                    .map(|s| ScenarioRef {
                        reason: Some(format!(
                            "{}it uses the other route",
                            crate::report::not_applicable::DOES_NOT_APPLY
                        )),
                        ..s
                    })
                    .collect(),
                aborted,
            },
            error => error,
        }
    }

    fn stopped(outcome: RunOutcome, why: &str) -> RunOutcome {
        match outcome {
            RunOutcome::Report {
                passed,
                failed,
                skipped,
                ..
            } => RunOutcome::Report {
                passed,
                failed,
                skipped,
                aborted: Some(why.to_owned()),
            },
            error => error,
        }
    }

    fn guard_message() -> String {
        crate::fixture_guard::message(
            "ns",
            "cp",
            &["status rewritten by field manager \"op\" (status)".into()],
        )
    }

    const DIFF: &str = "diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n";

    fn breaking(rules: &str) -> Variant {
        Variant::parse(
            "test",
            &format!("# name: test-variant\n# breaks: {rules}\n{DIFF}"),
        )
        .expect("a variant")
    }

    fn writer() -> Variant {
        variants()
            .iter()
            .find(|v| v.breakage == Breakage::ControlPlaneWriter)
            .expect("a control-plane writer")
            .clone()
    }

    #[rstest]
    #[case::caught(breaking("R-KEY-4"), report(&[1], &[2, 3], &[]), "caught")]
    #[case::missed(breaking("R-KEY-4"), report(&[1, 2], &[], &[]), "missed")]
    #[case::missed_when_only_skipped(breaking("R-KEY-4"), report(&[], &[], &[4]), "missed")]
    #[case::nothing_selected(breaking("R-KEY-4"), report(&[], &[], &[]), "missed")]
    #[case::failed_on_other_rules_only(breaking("R-KEY-13, R-DEL-3"), report(&[1], &[2, 3], &[]), "missed")]
    #[case::run_failed(breaking("R-KEY-4"), RunOutcome::Error("boom".into()), "error")]
    #[case::writer_stopped_by_the_guard(writer(), stopped(report(&[1], &[], &[]), &guard_message()), "stopped")]
    #[case::writer_stopped_for_another_reason(writer(), stopped(report(&[1], &[], &[]), "the operator exited"), "error")]
    #[case::writer_failing_scenarios_unstopped(writer(), report(&[1], &[2, 3], &[]), "missed")]
    #[case::rules_variant_stopped_by_the_guard(breaking("R-KEY-4"), stopped(report(&[1], &[2, 3], &[]), &guard_message()), "error")]
    fn verdicts(#[case] variant: Variant, #[case] outcome: RunOutcome, #[case] expected: &str) {
        let got = match verdict(&variant, &outcome) {
            Verdict::Caught(failed) => {
                assert_eq!(failed, vec![scenario(2), scenario(3)]);
                "caught"
            }
            Verdict::Stopped(message) => {
                assert_eq!(message, guard_message());
                "stopped"
            }
            Verdict::Missed { .. } => "missed",
            Verdict::Passed { .. } => "passed",
            Verdict::FalselyFailed(_) => "falsely failed",
            Verdict::Error(_) => "error",
        };
        assert_eq!(got, expected);
    }

    fn planned(variant: Variant, recorded_catches: bool) -> PlannedRun {
        PlannedRun {
            variant: Some(variant),
            round: 1,
            read_only: false,
            tags: "@R-KEY-4".into(),
            name: recorded_catches.then(|| "^(s2)$".into()),
            recorded_catches,
            fail_fast: true,
            report_dir: PathBuf::from("r"),
        }
    }

    /// A variant its recorded scenarios no longer catch runs on all its scenarios, still
    /// stopping at the first failure; one stopped at a failure on other rules runs in full; a
    /// catch ends it.
    #[rstest]
    #[case::recorded_and_caught(true, report(&[1], &[2], &[]), None)]
    #[case::recorded_and_passed(true, report(&[1], &[], &[]), Some((None, true)))]
    #[case::recorded_and_nothing_selected(true, report(&[], &[], &[]), Some((None, true)))]
    #[case::recorded_and_failed_elsewhere(true, RunOutcome::Report { passed: vec![], failed: vec![elsewhere(2)], skipped: vec![], aborted: None }, Some((None, true)))]
    #[case::all_and_caught(false, report(&[1], &[2], &[]), None)]
    #[case::all_and_failed_elsewhere(false, RunOutcome::Report { passed: vec![], failed: vec![elsewhere(2)], skipped: vec![], aborted: None }, Some((None, false)))]
    #[case::all_and_passed(false, report(&[1], &[], &[]), None)]
    fn the_next_attempt(
        #[case] recorded_catches: bool,
        #[case] outcome: RunOutcome,
        #[case] expected: Option<(Option<String>, bool)>,
    ) {
        let run = planned(breaking("R-KEY-4"), recorded_catches);
        let next = next_attempt(&run, &outcome).map(|(next, _)| (next.name, next.fail_fast));
        assert_eq!(next, expected);
    }

    /// A catch on a scenario no run of the unbroken operator passed needs that run.
    #[test]
    fn catches_outside_the_unbroken_operators_runs_are_unbacked() {
        let unbroken = PlannedRun {
            variant: None,
            ..planned(breaking("R-KEY-4"), false)
        };
        let results = vec![(unbroken, report(&[1, 2], &[], &[]))];
        let verdicts = vec![
            (
                breaking("R-KEY-4"),
                Verdict::Caught(vec![scenario(2), scenario(3)]),
            ),
            (
                breaking("R-KEY-4"),
                Verdict::Missed {
                    passed: 1,
                    failed: vec![scenario(4)],
                    skipped: 0,
                },
            ),
        ];
        let unbacked = unbacked_catches(&verdicts, &results);
        assert_eq!(
            unbacked.into_iter().collect::<Vec<_>>(),
            vec!["s3".to_owned()]
        );
    }

    /// Only the failures blamed on a rule the variant breaks catch it.
    #[test]
    fn a_catch_lists_only_the_failures_on_the_variants_rules() {
        let outcome = RunOutcome::Report {
            passed: vec![],
            failed: vec![elsewhere(7), scenario(8)],
            skipped: vec![],
            aborted: None,
        };
        assert_eq!(
            verdict(&breaking("R-KEY-4"), &outcome),
            Verdict::Caught(vec![scenario(8)])
        );
        assert_eq!(
            verdict(&breaking("R-ST-8"), &outcome),
            Verdict::Missed {
                passed: 0,
                failed: vec![elsewhere(7), scenario(8)],
                skipped: 0
            }
        );
    }

    #[rstest]
    #[case::clean(report(&[1, 2], &[], &[]), None)]
    #[case::a_failure(report(&[1], &[2], &[]), Some("failed f.feature:2 \"s2\": step 2 failed"))]
    #[case::a_skip(report(&[1], &[], &[3]), Some("skipped f.feature:3"))]
    #[case::not_applying(not_applying(report(&[1], &[], &[3])), None)]
    #[case::nothing_ran(report(&[], &[], &[]), Some("no scenario passed"))]
    #[case::run_failed(RunOutcome::Error("boom".into()), Some("boom"))]
    #[case::stopped(stopped(report(&[1, 2], &[], &[]), "fixture changed"), Some("the run was stopped: fixture changed"))]
    fn clean_runs_pass_everything(#[case] outcome: RunOutcome, #[case] problem: Option<&str>) {
        let found = unclean_run_problem(&outcome);
        match problem {
            None => assert_eq!(found, None),
            Some(fragment) => assert!(
                found.as_deref().is_some_and(|p| p.contains(fragment)),
                "{found:?}"
            ),
        }
    }

    #[test]
    fn a_header_gives_name_rules_selection_and_verdict() {
        let text = format!(
            "# name: tags-ignored-on-drift\n# breaks: R-KEY-13,  D-5\n# caught by: key_lifecycle.feature\n#\n# A change of tags is not drift.\n{DIFF}"
        );
        assert_eq!(
            parse_header(&text),
            Ok(PatchHeader {
                name: "tags-ignored-on-drift".into(),
                breaks: vec!["R-KEY-13".into(), "D-5".into()],
                consequences: vec![],
                scenarios: None,
                breakage: Breakage::Rules,
                permits: vec![],
                operator_cmd: None,
                replica_cmd: None,
                has_diff: true,
            })
        );
        let text = format!(
            "# name: writer\n# breaks: none\n# scenarios: @R-PRE-11 and not @slow\n# verdict: fixture-guard\n\n{DIFF}"
        );
        assert_eq!(
            parse_header(&text),
            Ok(PatchHeader {
                name: "writer".into(),
                breaks: vec![],
                consequences: vec![],
                scenarios: Some("@R-PRE-11 and not @slow".into()),
                breakage: Breakage::ControlPlaneWriter,
                permits: vec![],
                operator_cmd: None,
                replica_cmd: None,
                has_diff: true,
            })
        );
        let variant = Variant::parse("p", &text).expect("a variant");
        assert_eq!(variant.tag_expression(), "@R-PRE-11 and not @slow");
        assert_eq!(
            breaking("R-KEY-7, R-KEY-8").tag_expression(),
            "@R-KEY-7 or @R-KEY-8"
        );
    }

    #[test]
    fn a_legal_header_names_what_permits_it_and_may_only_change_the_start() {
        let text = "# name: sh-wrapped\n# permits: D-11, D-13\n# replica-cmd: {operator} run; exit $?\n#\n# Started through sh -c.\n";
        assert_eq!(
            parse_header(text),
            Ok(PatchHeader {
                name: "sh-wrapped".into(),
                breaks: vec![],
                consequences: vec![],
                scenarios: None,
                breakage: Breakage::Legal,
                permits: vec!["D-11".into(), "D-13".into()],
                operator_cmd: None,
                replica_cmd: Some("{operator} run; exit $?".into()),
                has_diff: false,
            })
        );
        let variant = Variant::parse("p", text).expect("a variant");
        assert!(variant.is_legal());
        assert_eq!(variant.tag_expression(), "", "the whole suite");
    }

    #[rstest]
    #[case::nothing_to_run("# name: x\n# permits: D-13\n", "no `# operator-cmd:`")]
    #[case::both("# name: x\n# permits: D-13\n# breaks: R-KEY-4\n", "neither breaks")]
    #[case::permits_nothing("# name: x\n# permits: none\n# operator-cmd: a\n", "names no rule")]
    #[case::start_of_a_bug(
        "# name: x\n# breaks: R-KEY-4\n# operator-cmd: a\n{DIFF}",
        "belong to legal"
    )]
    fn bad_legal_headers_say_what_is_wrong(#[case] header: &str, #[case] expected: &str) {
        let error = parse_header(&header.replace("{DIFF}", DIFF)).expect_err("refused");
        assert!(error.contains(expected), "{error}");
    }

    #[rstest]
    #[case::all_passed(report(&[1, 2], &[], &[]), "passed")]
    #[case::a_reasoned_skip(report(&[1], &[], &[3]), "passed")]
    #[case::a_failure(report(&[1], &[2], &[]), "FALSE")]
    #[case::stopped(stopped(report(&[1], &[], &[]), "fixture changed"), "FALSE")]
    #[case::nothing(report(&[], &[], &[]), "FALSE")]
    fn a_legal_variant_must_pass_what_it_runs(#[case] outcome: RunOutcome, #[case] expected: &str) {
        let variant = Variant::parse(
            "p",
            "# name: legal\n# permits: D-13\n# operator-cmd: {operator} run\n",
        )
        .expect("legal");
        let table = table(&[(variant.clone(), verdict(&variant, &outcome))]);
        assert!(table.contains(expected), "{table}");
    }

    #[rstest]
    #[case::no_name("# breaks: R-KEY-4\n", "no `# name:` line")]
    #[case::bad_name("# name: Tags Ignored\n# breaks: R-KEY-4\n", "not kebab-case")]
    #[case::no_breaks("# name: x\n", "no `# breaks:` line")]
    #[case::empty_rule("# name: x\n# breaks: R-KEY-4,\n", "not a rule id")]
    #[case::tag_for_rule("# name: x\n# breaks: @R-KEY-4\n", "not a rule id")]
    #[case::breaks_nothing("# name: x\n# breaks: none\n", "nothing could catch it")]
    #[case::writer_without_selection(
        "# name: x\n# breaks: none\n# verdict: fixture-guard\n",
        "`# scenarios:` must say"
    )]
    #[case::bad_verdict(
        "# name: x\n# breaks: R-KEY-4\n# verdict: maybe\n",
        "neither `rules` nor `fixture-guard`"
    )]
    #[case::bad_selection(
        "# name: x\n# breaks: R-KEY-4\n# scenarios: @a and and\n",
        "not a cucumber tag expression"
    )]
    #[case::twice("# name: x\n# name: y\n# breaks: R-KEY-4\n", "given twice")]
    fn bad_headers_say_what_is_wrong(#[case] header: &str, #[case] expected: &str) {
        let error = parse_header(&format!("{header}{DIFF}")).expect_err("refused");
        assert!(error.contains(expected), "{error}");
    }

    #[test]
    fn a_header_without_a_diff_is_refused() {
        let error = parse_header("# name: x\n# breaks: R-KEY-4\n").expect_err("refused");
        assert!(error.contains("no diff"), "{error}");
        // Only the leading comment lines are the header.
        let error =
            parse_header(&format!("{DIFF}# name: x\n# breaks: R-KEY-4\n")).expect_err("refused");
        assert!(error.contains("no `# name:`"), "{error}");
    }

    /// [`BUILT_IN`] is exactly the folder's patches, each named after its file.
    #[rstest]
    #[case("seeded", BUILT_IN, variants(), PATCH_DIR, false)]
    #[case("legal", BUILT_IN_LEGAL, legal_variants(), LEGAL_DIR, true)]
    fn the_built_in_list_is_the_patch_folder(
        #[case] folder: &str,
        #[case] built_in: &[(&str, &str)],
        #[case] parsed: &[Variant],
        #[case] origin_dir: &str,
        #[case] legal: bool,
    ) {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(folder);
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .expect("the patch folder")
            .map(|entry| {
                entry
                    .expect("entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .filter(|name| name.ends_with(".patch"))
            .collect();
        on_disk.sort_unstable();
        let mut listed: Vec<String> = built_in
            .iter()
            .map(|(file, _)| (*file).to_owned())
            .collect();
        listed.sort_unstable();
        assert_eq!(
            listed, on_disk,
            "the built-in list in seeded.rs lists conformance/{folder}/*.patch"
        );
        for variant in parsed {
            assert_eq!(
                variant.origin,
                format!("{origin_dir}/{}.patch", variant.name),
                "a patch file is named after its variant"
            );
            assert_eq!(
                variant.is_legal(),
                legal,
                "{}: in the wrong folder",
                variant.name
            );
        }
    }

    #[test]
    fn variant_names_are_unique_and_writers_alone_break_no_rule() {
        let mut names: Vec<&str> = variants().iter().map(|v| v.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), variants().len());
        for variant in variants() {
            assert_eq!(
                variant.breaks.is_empty(),
                variant.breakage == Breakage::ControlPlaneWriter,
                "{}: only a control-plane writer breaks no rule",
                variant.name
            );
        }
        assert_eq!(variants()[1].tag_expression(), "@R-KEY-7 or @R-KEY-8");
    }

    /// Every rule a variant names, and every tag of its selection, tags at least one scenario
    /// of the suite, so no variant's run can be empty by a typo.
    #[test]
    fn every_rule_of_every_variant_tags_a_scenario() {
        let features = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../features"));
        let mut text = String::new();
        for entry in std::fs::read_dir(features).expect("features folder") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|e| e == "feature") {
                text.push_str(&std::fs::read_to_string(&path).expect("feature file"));
            }
        }
        let tags: BTreeSet<&str> = text
            .split_whitespace()
            .filter_map(|word| word.strip_prefix('@'))
            .collect();
        for variant in variants() {
            let selection = variant.tag_expression();
            let selected = selection
                .split(|c: char| c.is_whitespace() || c == '(' || c == ')')
                .filter_map(|word| word.strip_prefix('@'));
            for rule in variant.breaks.iter().map(String::as_str).chain(selected) {
                assert!(
                    tags.contains(rule),
                    "{}: no scenario is tagged @{rule}",
                    variant.name
                );
            }
        }
    }

    /// A refactor that touches the code a patch changes makes the patch stop applying: this
    /// test then fails naming it, so the mistake it re-creates is looked at again.
    #[test]
    fn every_built_in_patch_applies_to_this_tree() {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut broken = Vec::new();
        // A legal variant that only changes how it is started holds no diff to apply.
        let all = variants()
            .iter()
            .chain(legal_variants().iter().filter(|v| v.has_diff))
            .map(|v| (v.origin.as_str(), v.patch.as_str()));
        for (origin, text) in all {
            let mut child = std::process::Command::new("git")
                .args(["apply", "--check", "-"])
                .current_dir(&repo)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("git");
            {
                use std::io::Write as _;
                let mut stdin = child.stdin.take().expect("stdin");
                stdin.write_all(text.as_bytes()).expect("writing the patch");
            }
            let output = child.wait_with_output().expect("git apply --check");
            if !output.status.success() {
                broken.push(format!(
                    "{origin}: {}",
                    String::from_utf8_lossy(&output.stderr).trim()
                ));
            }
        }
        assert!(
            broken.is_empty(),
            "seeded variants that no longer apply (re-create each mistake on the new code):\n{}",
            broken.join("\n")
        );
    }

    #[test]
    fn unknown_variants_are_refused_with_the_known_names() {
        let error =
            selected_variants(&[], &["no-such-bug".to_owned()], false).expect_err("unknown");
        assert!(
            error.to_string().contains("tags-ignored-on-drift"),
            "{error}"
        );
        assert_eq!(
            selected_variants(&[], &[], false).expect("all").len(),
            BUILT_IN.len()
        );
    }

    #[test]
    fn patch_files_replace_the_built_in_set() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("mine.patch");
        std::fs::write(
            &path,
            format!("# name: my-mistake\n# breaks: R-KEY-4\n# ignored: yes\n{DIFF}"),
        )
        .expect("writing");
        let selected = selected_variants(std::slice::from_ref(&path), &[], false).expect("parsed");
        assert_eq!(selected.len(), 1);
        assert_eq!(selected[0].name, "my-mistake");
        assert_eq!(selected[0].origin, path.display().to_string());
        std::fs::write(&path, DIFF).expect("writing");
        let error =
            selected_variants(std::slice::from_ref(&path), &[], false).expect_err("no header");
        assert!(
            error.to_string().contains(&path.display().to_string()),
            "the error names the file: {error}"
        );
    }

    #[test]
    fn blame_is_precise_when_every_blamed_rule_is_the_variants_own() {
        let variant = Variant::parse(
            "test",
            "# name: test\n# breaks: R-KEY-4\n# consequences: R-KEY-25\ndiff --git a/x b/x\n",
        )
        .expect("a header");
        let mut own = scenario(1);
        own.failed_rules = vec!["R-KEY-4".into(), "R-KEY-25".into()];
        let mut blames_none = scenario(3);
        blames_none.failed_rules.clear();
        let outcome = RunOutcome::Report {
            passed: vec![],
            failed: vec![own, elsewhere(2), blames_none],
            skipped: vec![],
            aborted: None,
        };
        let precision = BlamePrecision::of([(&variant, &outcome)]);
        assert_eq!(precision.failed, 3);
        let imprecise: Vec<&str> = precision
            .imprecise
            .iter()
            .map(|(_, scenario, _)| scenario.as_str())
            .collect();
        assert_eq!(imprecise, ["f.feature:2 s2", "f.feature:3 s3"]);
        assert!(
            precision
                .to_string()
                .starts_with("blame precision: 1 of 3 failed scenarios (33.3 %)"),
            "{precision}"
        );
    }

    #[test]
    fn the_table_says_caught_missed_or_error_per_variant() {
        let variants = variants();
        let verdicts = vec![
            (variants[2].clone(), Verdict::Caught(vec![scenario(11)])),
            (
                variants[3].clone(),
                Verdict::Missed {
                    passed: 2,
                    failed: vec![],
                    skipped: 0,
                },
            ),
            (
                variants[4].clone(),
                Verdict::Missed {
                    passed: 0,
                    failed: vec![],
                    skipped: 0,
                },
            ),
            (
                variants[5].clone(),
                Verdict::Missed {
                    passed: 1,
                    failed: vec![elsewhere(12)],
                    skipped: 0,
                },
            ),
            (writer(), Verdict::Stopped(guard_message())),
            (
                writer(),
                Verdict::Missed {
                    passed: 1,
                    failed: vec![scenario(1)],
                    skipped: 0,
                },
            ),
            (
                variants[6].clone(),
                Verdict::Error("the patch conformance/seeded/x.patch does not apply".into()),
            ),
        ];
        let text = table(&verdicts);
        assert!(
            text.contains("daemon-without-coder-command")
                && text.contains("caught")
                && text.contains("f.feature:11 \"s11\""),
            "{text}"
        );
        assert!(
            text.contains("MISSED") && text.contains("none (2 passed, 0 skipped)"),
            "{text}"
        );
        assert!(text.contains("no scenario is selected"), "{text}");
        assert!(
            text.contains("none on the rules it breaks (1 passed, 0 skipped; failed on other rules: f.feature:12 \"s12\")"),
            "{text}"
        );
        assert!(
            text.contains("caught   none; the run was stopped: someone other than the suite changed its control-plane fixture CoderControlPlane ns/cp: status rewritten by field manager \"op\" (status)\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "MISSED   the fixture guard did not stop the run (1 passed, 1 failed, 0 skipped)"
            ),
            "{text}"
        );
        assert!(
            text.contains("ERROR    the patch conformance/seeded/x.patch does not apply"),
            "{text}"
        );
    }
}
