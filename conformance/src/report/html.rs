//! The report page: one self-contained HTML file that a person reads in a browser, rendered from a
//! [`ConformanceReport`] alone. CSS is inline; there is no script and nothing is fetched (no
//! fonts, images or styles from elsewhere). Every text of the report is HTML-escaped, and every
//! internal link (`href="#…"`) names an `id` of the page.
//!
//! `conformance run` writes it beside the YAML ([`crate::paths::HTML_REPORT_FILE`]);
//! `conformance report --html <report.yaml> [--out FILE]` renders it again from any report.
//! The claims are phrased as the terminal summary phrases them (`crate::run::summary`): `yes`,
//! `no`, or `not claimed` for a partial run, with the reason.
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;

use crate::paths::HTML_REPORT_FILE;
use crate::report::model::{
    ConformanceReport, Level, ManifestSet, RuleCoverage, RuleVerdict, ScenarioResult, Status, Tally,
};
use crate::run::summary::left_out_by_the_run;

/// `conformance report`: renders a conformance report for people.
#[derive(Args, Debug, Clone)]
pub struct ReportArgs {
    /// The conformance report (YAML) to render as one self-contained HTML page.
    #[arg(long, value_name = "REPORT_YAML")]
    pub html: PathBuf,
    /// Where to write the page (default: report.html beside the YAML). The links to the
    /// diagnostics folders are relative to the report folder, so they work beside the YAML.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// `conformance report --html`: reads the YAML, writes the page, prints its path.
pub fn run(args: &ReportArgs) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(&args.html)
        .with_context(|| format!("reading {}", args.html.display()))?;
    let report = ConformanceReport::from_yaml(&text)
        .with_context(|| format!("reading {}", args.html.display()))?;
    let out = args.out.clone().unwrap_or_else(|| beside(&args.html));
    write(&report, &out)?;
    println!("{}", out.display());
    Ok(ExitCode::SUCCESS)
}

/// `report.html` in the folder of `yaml`.
pub fn beside(yaml: &Path) -> PathBuf {
    yaml.with_file_name(HTML_REPORT_FILE)
}

/// Renders the page and writes it to `path`.
pub fn write(report: &ConformanceReport, path: &Path) -> anyhow::Result<()> {
    std::fs::write(path, render(report)).with_context(|| format!("writing {}", path.display()))
}

/// Escapes `&`, `<`, `>`, `"` and `'`: safe in text and in double- or single-quoted attributes.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

/// A relative link to `path` (a folder of the report folder): percent-encoded, so that no scheme
/// (`javascript:`) or host (`//…`) can be read into it, and starting with `./`.
fn relative_href(path: &str) -> String {
    let mut href = String::from("./");
    for byte in path.trim_start_matches("./").bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~/".contains(&byte) {
            href.push(char::from(byte));
        } else {
            let _ = write!(href, "%{byte:02X}");
        }
    }
    href
}

/// The sections of the page, in order: (id, title).
const SECTIONS: [(&str, &str); 8] = [
    ("summary", "Summary and claims"),
    ("failures", "Failed scenarios"),
    ("skipped", "Skipped scenarios"),
    ("rules", "Rules"),
    ("scenarios", "All scenarios"),
    ("environment", "Environment"),
    ("setup", "Setup"),
    ("suite", "Suite"),
];

const STYLE: &str = "
:root{--fg:#1c2330;--muted:#5b6475;--line:#d8dde6;--bg:#fff;--soft:#f4f6f9;
--pass:#17663a;--pass-bg:#e3f4e9;--fail:#a61b1b;--fail-bg:#fbe5e5;--skip:#7a5300;--skip-bg:#fdf1d6;
--none:#4a5160;--none-bg:#eceef2;--link:#1d4fb8}
*{box-sizing:border-box}
body{margin:0;color:var(--fg);background:var(--bg);font:15px/1.5 system-ui,-apple-system,'Segoe UI',Roboto,'DejaVu Sans',sans-serif}
main{max-width:1180px;margin:0 auto;padding:24px 32px 64px}
header{background:var(--soft);border-bottom:1px solid var(--line)}
header .inner{max-width:1180px;margin:0 auto;padding:20px 32px}
h1{font-size:26px;margin:0 0 4px}
h2{font-size:20px;margin:36px 0 12px;padding-bottom:4px;border-bottom:2px solid var(--line)}
main>h2:first-child{margin-top:4px}
h3{font-size:16px;margin:20px 0 8px}
a{color:var(--link)}
code,pre,.mono{font-family:ui-monospace,'DejaVu Sans Mono',Menlo,Consolas,monospace;font-size:13px}
pre{background:var(--soft);border:1px solid var(--line);border-radius:6px;padding:10px 12px;white-space:pre-wrap;word-break:break-word;margin:4px 0}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:2px 18px;margin:8px 0}
dl.facts dt{color:var(--muted)}
dl.facts dd{margin:0;word-break:break-word}
nav.toc{margin:16px 0 0;font-size:14px}
nav.toc a{margin-right:14px;white-space:nowrap}
table{border-collapse:collapse;width:100%;margin:8px 0 16px;font-size:14px}
th,td{text-align:left;vertical-align:top;padding:5px 8px;border-bottom:1px solid var(--line)}
th{background:var(--soft);font-weight:600}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.nowrap{white-space:nowrap}
table.counts{width:auto;min-width:620px}
table.counts td.num,table.counts th.num{padding-left:28px}
.badge{display:inline-block;padding:0 8px;border-radius:10px;font-size:12.5px;font-weight:600;white-space:nowrap}
.pass{color:var(--pass);background:var(--pass-bg)}
.fail{color:var(--fail);background:var(--fail-bg)}
.skip{color:var(--skip);background:var(--skip-bg)}
.none{color:var(--none);background:var(--none-bg)}
.claims{display:grid;grid-template-columns:1fr 1fr;gap:16px;margin:12px 0}
.claim{border:1px solid var(--line);border-left-width:6px;border-radius:6px;padding:12px 16px}
.claim.pass{border-left-color:var(--pass);background:var(--pass-bg);color:var(--fg)}
.claim.fail{border-left-color:var(--fail);background:var(--fail-bg);color:var(--fg)}
.claim.none{border-left-color:var(--none);background:var(--none-bg);color:var(--fg)}
.claim .title{font-size:14px;color:var(--muted)}
.claim .verdict{font-size:24px;font-weight:700}
.notice{border:1px solid var(--fail);background:var(--fail-bg);border-radius:6px;padding:10px 14px;margin:12px 0}
.muted{color:var(--muted)}
article.failure{border:1px solid var(--line);border-left:6px solid var(--fail);border-radius:6px;padding:8px 16px 12px;margin:12px 0}
article.failure h3{margin-top:6px}
ul.plain{margin:4px 0;padding-left:18px}
details summary{cursor:pointer;color:var(--link)}
@media print{header{background:none}.claims{grid-template-columns:1fr 1fr}}
";

/// Anchors of the page's rules and scenarios: readable, and unique among themselves and the
/// sections'.
struct Anchors {
    rules: BTreeMap<String, String>,
    /// (feature, line) → the anchor of its row in the scenario table.
    scenarios: BTreeMap<(String, usize), String>,
}

fn slug(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .collect()
}

fn unique(taken: &mut BTreeSet<String>, base: String) -> String {
    if taken.insert(base.clone()) {
        return base;
    }
    (2..)
        .map(|n| format!("{base}-{n}"))
        .find(|candidate| taken.insert(candidate.clone()))
        .expect("an unused anchor")
}

impl Anchors {
    fn new(report: &ConformanceReport) -> Anchors {
        let mut taken: BTreeSet<String> = SECTIONS.iter().map(|(id, _)| (*id).to_owned()).collect();
        let mut rules = BTreeMap::new();
        for rule in &report.coverage {
            rules
                .entry(rule.rule.clone())
                .or_insert_with(|| unique(&mut taken, format!("rule-{}", slug(&rule.rule))));
        }
        let mut scenarios = BTreeMap::new();
        for result in &report.results {
            scenarios
                .entry((result.feature.clone(), result.line))
                .or_insert_with(|| {
                    let feature = slug(result.feature.trim_end_matches(".feature"));
                    unique(&mut taken, format!("scenario-{feature}-{}", result.line))
                });
        }
        Anchors { rules, scenarios }
    }

    /// The rule's id as a link to its row, or as text when the report has no row for it.
    fn rule_link(&self, rule: &str) -> String {
        match self.rules.get(rule) {
            Some(id) => format!("<a href=\"#{id}\">{}</a>", escape(rule)),
            None => escape(rule),
        }
    }

    /// `feature:line` as a link to the scenario's row, or as text when it has no result.
    fn scenario_link(&self, feature: &str, line: usize) -> String {
        let text = escape(&format!("{feature}:{line}"));
        match self.scenarios.get(&(feature.to_owned(), line)) {
            Some(id) => format!("<a href=\"#{id}\">{text}</a>"),
            None => text,
        }
    }
}

/// The counts of one level, with the scenarios the run left out apart from its skips.
#[derive(Default, Clone, Copy)]
struct Counts {
    passed: usize,
    failed: usize,
    skipped: usize,
    not_run: usize,
    flaky: usize,
}

impl Counts {
    fn of(tally: &Tally, not_run: usize) -> Counts {
        Counts {
            passed: tally.passed,
            failed: tally.failed,
            skipped: tally.skipped.saturating_sub(not_run),
            not_run,
            flaky: tally.flaky,
        }
    }

    fn plus(self, other: Counts) -> Counts {
        Counts {
            passed: self.passed + other.passed,
            failed: self.failed + other.failed,
            skipped: self.skipped + other.skipped,
            not_run: self.not_run + other.not_run,
            flaky: self.flaky + other.flaky,
        }
    }

    fn is_empty(self) -> bool {
        self.passed + self.failed + self.skipped + self.not_run == 0
    }
}

/// A level's claim: the word the terminal prints (`yes`, `no`, `not claimed`), its style and why.
struct Claim {
    word: &'static str,
    class: &'static str,
    why: String,
}

/// The claim for `level` from the counts that bear on it (for Extended: Core's and Extended's),
/// as the terminal summary decides it: a partial run neither claims nor denies conformance
/// unless a scenario it ran failed; a skip this run could not avoid denies it.
fn claim(
    conformant: bool,
    counts: Counts,
    what: &str,
    aborted: Option<&str>,
    none_ran: &str,
) -> Claim {
    let plural = |n: usize, one: &str, many: &str| {
        if n == 1 {
            format!("1 {one}")
        } else {
            format!("{n} {many}")
        }
    };
    if conformant {
        return Claim {
            word: "yes",
            class: "pass",
            why: format!(
                "every {what} scenario passed ({}), none failed or was skipped",
                counts.passed
            ),
        };
    }
    if counts.failed > 0 {
        return Claim {
            word: "no",
            class: "fail",
            why: format!(
                "{} failed: see <a href=\"#failures\">Failed scenarios</a>",
                plural(
                    counts.failed,
                    &format!("{what} scenario"),
                    &format!("{what} scenarios")
                )
            ),
        };
    }
    if let Some(reason) = aborted {
        return Claim {
            word: "no",
            class: "fail",
            why: format!("the run was stopped before its end: {}", escape(reason)),
        };
    }
    if counts.not_run == 0 && counts.skipped > 0 {
        return Claim {
            word: "no",
            class: "fail",
            why: format!(
                "{} skipped, each with its reason under <a href=\"#skipped\">Skipped scenarios</a>; none failed",
                plural(counts.skipped, "scenario", "scenarios")
            ),
        };
    }
    if counts.not_run == 0 {
        return Claim {
            word: "no",
            class: "fail",
            why: escape(none_ran),
        };
    }
    Claim {
        word: "not claimed",
        class: "none",
        why: format!(
            "a partial run: {} not run (not selected by --tags/--name, or not started before the run stopped)",
            plural(counts.not_run, "scenario", "scenarios")
        ),
    }
}

fn status_badge(status: Status, flaky: bool) -> String {
    let (class, word) = match status {
        Status::Passed => ("pass", "passed"),
        Status::Failed => ("fail", "failed"),
        Status::Skipped => ("skip", "skipped"),
    };
    let mut badge = format!("<span class=\"badge {class}\">{word}</span>");
    if flaky {
        badge.push_str(" <span class=\"badge skip\">flaky</span>");
    }
    badge
}

fn verdict_badge(verdict: Option<RuleVerdict>) -> String {
    match verdict {
        None => "<span class=\"muted\">no verdict</span>".to_owned(),
        Some(verdict) => {
            let class = match verdict {
                RuleVerdict::Passed => "pass",
                RuleVerdict::Failed => "fail",
                RuleVerdict::NotReached => "skip",
                RuleVerdict::NotRun | RuleVerdict::NotApplicable => "none",
            };
            format!("<span class=\"badge {class}\">{}</span>", verdict.label())
        }
    }
}

fn level_name(level: Option<Level>) -> &'static str {
    match level {
        Some(Level::Core) => "Core",
        Some(Level::Extended) => "Extended",
        None => "no level",
    }
}

fn duration(ms: u64) -> String {
    if ms < 1_000 {
        format!("{ms} ms")
    } else if ms < 60_000 {
        format!("{:.1} s", ms as f64 / 1_000.0)
    } else {
        format!("{} min {} s", ms / 60_000, (ms % 60_000) / 1_000)
    }
}

/// A `<dl>` of (label, HTML) pairs.
fn facts(out: &mut String, rows: &[(&str, String)]) {
    out.push_str("<dl class=\"facts\">");
    for (label, value) in rows {
        let _ = write!(out, "<dt>{}</dt><dd>{value}</dd>", escape(label));
    }
    out.push_str("</dl>\n");
}

fn code(text: &str) -> String {
    format!("<code>{}</code>", escape(text))
}

/// Text, or a muted dash for an empty one.
fn or_dash(text: &str) -> String {
    if text.is_empty() {
        "<span class=\"muted\">—</span>".to_owned()
    } else {
        escape(text)
    }
}

/// Renders the whole page.
pub fn render(report: &ConformanceReport) -> String {
    let anchors = Anchors::new(report);
    let implementation = &report.implementation;
    let mut out = String::with_capacity(64 * 1024 + report.results.len() * 600);
    let title = format!(
        "Conformance report: {} {}",
        implementation.name, implementation.version
    );
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n",
        escape(&title)
    );
    header(&mut out, report);
    out.push_str("<main>\n");
    summary_section(&mut out, report);
    failures_section(&mut out, report, &anchors);
    skipped_section(&mut out, report, &anchors);
    rules_section(&mut out, report, &anchors);
    scenarios_section(&mut out, report, &anchors);
    environment_section(&mut out, report);
    setup_section(&mut out, report);
    suite_section(&mut out, report);
    out.push_str("</main>\n</body>\n</html>\n");
    out
}

fn header(out: &mut String, report: &ConformanceReport) {
    let implementation = &report.implementation;
    out.push_str("<header><div class=\"inner\">\n");
    let _ = writeln!(
        out,
        "<h1>Conformance report: {} <span class=\"muted\">{}</span></h1>",
        escape(&implementation.name),
        escape(&implementation.version)
    );
    let url = &implementation.url;
    let url_html = if url.starts_with("https://") || url.starts_with("http://") {
        format!("<a href=\"{0}\">{0}</a>", escape(url))
    } else {
        or_dash(url)
    };
    let commit = if report.suite.git_commit.is_empty() {
        String::new()
    } else {
        format!(", commit {}", code(&report.suite.git_commit))
    };
    let digest = match report.compute_digest() {
        Ok(digest) if digest == report.digest => {
            format!("{} (matches the content)", code(&report.digest))
        }
        Ok(_) => format!(
            "{} <span class=\"badge fail\">does not match the content: the report was edited after the run</span>",
            code(&report.digest)
        ),
        Err(error) => format!("cannot be computed: {}", escape(&format!("{error:#}"))),
    };
    facts(
        out,
        &[
            ("Implementation", escape(&implementation.name)),
            ("Version", or_dash(&implementation.version)),
            ("URL", url_html),
            ("Contact", or_dash(&implementation.contact)),
            ("Mode", or_dash(&implementation.mode)),
            (
                "Suite",
                format!("version {}{commit}", escape(&report.suite.version)),
            ),
            (
                "Run",
                format!(
                    "started {}, took {}, tier {}",
                    escape(&report.started_at),
                    duration(report.duration_ms),
                    escape(&report.environment.tier)
                ),
            ),
            ("Digest", digest),
        ],
    );
    out.push_str("<nav class=\"toc\" aria-label=\"Contents\"><strong>Contents:</strong> ");
    for (id, title) in SECTIONS {
        let _ = write!(out, "<a href=\"#{id}\">{}</a>", escape(title));
    }
    out.push_str("</nav>\n</div></header>\n");
}

fn section_heading(out: &mut String, id: &str) {
    let title = SECTIONS
        .iter()
        .find(|(section, _)| *section == id)
        .map_or(id, |(_, title)| title);
    let _ = writeln!(out, "<h2 id=\"{id}\">{}</h2>", escape(title));
}

fn summary_section(out: &mut String, report: &ConformanceReport) {
    section_heading(out, "summary");
    let not_run = |level: Option<Level>| {
        report
            .results
            .iter()
            .filter(|r| r.level == level && left_out_by_the_run(r))
            .count()
    };
    let summary = &report.summary;
    let core = Counts::of(&summary.core, not_run(Some(Level::Core)));
    let extended = Counts::of(&summary.extended, not_run(Some(Level::Extended)));
    let unlevelled = Counts::of(&summary.unlevelled, not_run(None));
    if let Some(reason) = &report.aborted {
        let _ = writeln!(
            out,
            "<p class=\"notice\"><strong>The run was stopped before its end:</strong> {}. It claims no conformance.</p>",
            escape(reason)
        );
    }
    let core_claim = claim(
        summary.core_conformant,
        core,
        "Core",
        report.aborted.as_deref(),
        "no Core scenario ran",
    );
    let extended_claim = claim(
        summary.extended_conformant,
        core.plus(extended),
        "Core or Extended",
        report.aborted.as_deref(),
        if core.passed == 0 {
            "no Core scenario ran (Extended conformance needs Core conformance)"
        } else {
            "no Extended scenario ran"
        },
    );
    out.push_str("<div class=\"claims\">\n");
    for (level, claim) in [("Core", core_claim), ("Extended", extended_claim)] {
        let _ = writeln!(
            out,
            "<div class=\"claim {}\"><div class=\"title\">{level} conformance</div>\
             <div class=\"verdict\">{}</div><div>{}</div></div>",
            claim.class, claim.word, claim.why
        );
    }
    out.push_str("</div>\n");
    out.push_str(
        "<p class=\"muted\">This page shows the report as it was written. \
         <code>conformance verify-report</code> checks it against the suite \
         (schema, digest, feature hashes, every scenario listed, the rule verdicts).</p>\n",
    );
    out.push_str(
        "<table class=\"counts\"><thead><tr><th>Level</th><th class=\"num\">Passed</th><th class=\"num\">Failed</th>\
         <th class=\"num\">Skipped</th><th class=\"num\">Not run</th><th class=\"num\">Flaky</th></tr></thead><tbody>\n",
    );
    let mut rows = vec![("Core", core), ("Extended", extended)];
    if !unlevelled.is_empty() {
        rows.push(("No level (a suite defect)", unlevelled));
    }
    rows.push(("Total", core.plus(extended).plus(unlevelled)));
    for (name, counts) in rows {
        let _ = writeln!(
            out,
            "<tr><th>{}</th><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
            escape(name),
            counts.passed,
            counts.failed,
            counts.skipped,
            counts.not_run,
            counts.flaky
        );
    }
    out.push_str("</tbody></table>\n");
    out.push_str(
        "<p class=\"muted\">Not run: scenarios this run left out (not selected by --tags/--name, or not \
         started before the run stopped); they are not counted as skips. Flaky: passed only on a retry.</p>\n",
    );
    if report.coverage.iter().any(|r| r.verdict.is_some()) {
        let (observable, unobservable): (Vec<&RuleCoverage>, Vec<&RuleCoverage>) = report
            .coverage
            .iter()
            .partition(|r| r.unobservable.is_none());
        let count = |verdict: RuleVerdict| {
            observable
                .iter()
                .filter(|r| r.verdict == Some(verdict))
                .count()
        };
        let _ = writeln!(
            out,
            "<p><strong>Rules:</strong> {} passed, {} failed, {} not reached, {} not run; {} not observable \
             (see <a href=\"#rules\">Rules</a>).</p>",
            count(RuleVerdict::Passed),
            count(RuleVerdict::Failed),
            count(RuleVerdict::NotReached),
            count(RuleVerdict::NotRun),
            unobservable.len()
        );
    }
    if !report.environment.simulated.is_empty() {
        out.push_str(
            "<p><strong>Simulated by the suite</strong> (contract D-8):</p><ul class=\"plain\">",
        );
        for note in &report.environment.simulated {
            let _ = write!(out, "<li>{}</li>", escape(note));
        }
        out.push_str("</ul>\n");
    }
}

fn rules_section(out: &mut String, report: &ConformanceReport, anchors: &Anchors) {
    section_heading(out, "rules");
    if report.coverage.is_empty() {
        out.push_str("<p class=\"muted\">This report has no rule coverage.</p>\n");
        return;
    }
    out.push_str(
        "<p class=\"muted\">Each rule of the suite's catalogue, its verdict from the scenarios that check it \
         (passed, failed, not reached, not run), and what each of those scenarios says of it.</p>\n",
    );
    out.push_str(
        "<table><thead><tr><th>Rule</th><th>Level</th><th>Verdict</th><th>Scenarios</th><th>Notes</th></tr></thead><tbody>\n",
    );
    let mut seen = BTreeSet::new();
    for rule in &report.coverage {
        // A duplicated rule (an invalid report) keeps its anchor on the first row.
        let id = anchors
            .rules
            .get(&rule.rule)
            .filter(|id| seen.insert((*id).clone()));
        let mut scenarios = String::new();
        if rule.scenarios.is_empty() {
            scenarios.push_str("<span class=\"muted\">none</span>");
        }
        for (i, scenario) in rule.scenarios.iter().enumerate() {
            if i > 0 {
                scenarios.push_str("<br>");
            }
            let said = match scenario.verdict {
                Some(verdict) => verdict_badge(Some(verdict)),
                None => status_badge(scenario.status, false),
            };
            let _ = write!(
                scenarios,
                "<span class=\"nowrap\">{} {said}</span>",
                anchors.scenario_link(&scenario.feature, scenario.line)
            );
        }
        let mut notes = Vec::new();
        if let Some(reason) = &rule.unobservable {
            notes.push(format!("not observable: {}", escape(reason)));
        }
        if !rule.seeded_variants.is_empty() {
            let variants: Vec<String> = rule.seeded_variants.iter().map(|v| code(v)).collect();
            notes.push(format!("seeded variants: {}", variants.join(", ")));
        }
        let id_attr = id.map(|id| format!(" id=\"{id}\"")).unwrap_or_default();
        let _ = writeln!(
            out,
            "<tr{id_attr}><td class=\"mono nowrap\">{}</td><td>{}</td><td>{}</td><td>{scenarios}</td><td>{}</td></tr>",
            escape(&rule.rule),
            level_name(Some(rule.level)),
            verdict_badge(rule.verdict),
            notes.join("<br>")
        );
    }
    out.push_str("</tbody></table>\n");
}

fn rule_links(anchors: &Anchors, rules: &[String]) -> String {
    if rules.is_empty() {
        return "<span class=\"muted\">—</span>".to_owned();
    }
    rules
        .iter()
        .map(|r| anchors.rule_link(r))
        .collect::<Vec<_>>()
        .join(", ")
}

fn failures_section(out: &mut String, report: &ConformanceReport, anchors: &Anchors) {
    section_heading(out, "failures");
    let failed: Vec<&ScenarioResult> = report
        .results
        .iter()
        .filter(|r| r.status == Status::Failed)
        .collect();
    if failed.is_empty() {
        out.push_str("<p>No scenario failed.</p>\n");
        return;
    }
    for result in failed {
        let _ = writeln!(
            out,
            "<article class=\"failure\"><h3>{} <span class=\"muted\">{}</span></h3>",
            escape(&result.scenario),
            anchors.scenario_link(&result.feature, result.line)
        );
        let failing_step = match result.failed_step {
            Some(line) => code(&format!("{}:{line}", result.feature)),
            None => "<span class=\"muted\">not recorded (a hook or a check after the steps)</span>"
                .to_owned(),
        };
        let diagnostics = match &result.diagnostics {
            Some(folder) => {
                let shown = format!("{}/", folder.trim_end_matches('/'));
                format!(
                    "<a href=\"{}\">{}</a>",
                    escape(&relative_href(&shown)),
                    escape(&shown)
                )
            }
            None => "<span class=\"muted\">none written</span>".to_owned(),
        };
        let message = match &result.reason {
            Some(reason) => format!("<pre>{}</pre>", escape(reason)),
            None => "<span class=\"muted\">none recorded</span>".to_owned(),
        };
        facts(
            out,
            &[
                ("Level", level_name(result.level).to_owned()),
                ("Failing step", failing_step),
                ("Message", message),
                ("Blamed rules", rule_links(anchors, &result.failed_rules)),
                ("Rules it checks", rule_links(anchors, &result.rules)),
                ("Diagnostics", diagnostics),
                (
                    "Attempts",
                    format!("{}, took {}", result.attempts, duration(result.duration_ms)),
                ),
            ],
        );
        out.push_str("</article>\n");
    }
}

fn skipped_section(out: &mut String, report: &ConformanceReport, anchors: &Anchors) {
    section_heading(out, "skipped");
    let (left_out, skipped): (Vec<&ScenarioResult>, Vec<&ScenarioResult>) = report
        .results
        .iter()
        .filter(|r| r.status == Status::Skipped)
        .partition(|r| left_out_by_the_run(r));
    let table = |out: &mut String, rows: &[&ScenarioResult]| {
        out.push_str(
            "<table><thead><tr><th>Scenario</th><th>Feature</th><th>Level</th><th>Reason</th></tr></thead><tbody>\n",
        );
        for result in rows {
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td class=\"mono nowrap\">{}</td><td>{}</td><td>{}</td></tr>",
                escape(&result.scenario),
                anchors.scenario_link(&result.feature, result.line),
                level_name(result.level),
                result.reason.as_deref().map_or_else(
                    || "<span class=\"badge fail\">no reason given</span>".to_owned(),
                    escape
                )
            );
        }
        out.push_str("</tbody></table>\n");
    };
    if skipped.is_empty() {
        out.push_str("<p>No scenario was skipped.</p>\n");
    } else {
        out.push_str(
            "<p class=\"muted\">Scenarios this run could not execute here, each with its reason: nothing failed, \
             but nothing proves the rules they check.</p>\n",
        );
        table(out, &skipped);
    }
    if !left_out.is_empty() {
        let _ = writeln!(
            out,
            "<details><summary>{} scenario(s) not run: not selected by --tags/--name, or not started before the run stopped</summary>",
            left_out.len()
        );
        table(out, &left_out);
        out.push_str("</details>\n");
    }
}

fn scenarios_section(out: &mut String, report: &ConformanceReport, anchors: &Anchors) {
    section_heading(out, "scenarios");
    if report.results.is_empty() {
        out.push_str("<p class=\"muted\">This report lists no scenario.</p>\n");
        return;
    }
    out.push_str(
        "<table><thead><tr><th>Feature</th><th>Scenario</th><th>Level</th><th>Status</th>\
         <th>Rules</th><th class=\"num\">Attempts</th><th class=\"num\">Duration</th></tr></thead><tbody>\n",
    );
    let mut seen = BTreeSet::new();
    for result in &report.results {
        // A duplicated row (an invalid report) keeps its anchor on the first.
        let id_attr = match anchors
            .scenarios
            .get(&(result.feature.clone(), result.line))
        {
            Some(id) if seen.insert(id.clone()) => format!(" id=\"{id}\""),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "<tr{id_attr}><td class=\"mono nowrap\">{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"mono\">{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
            escape(&format!("{}:{}", result.feature, result.line)),
            escape(&result.scenario),
            level_name(result.level),
            status_badge(result.status, result.flaky),
            rule_links(anchors, &result.rules),
            result.attempts,
            duration(result.duration_ms)
        );
    }
    out.push_str("</tbody></table>\n");
}

fn environment_section(out: &mut String, report: &ConformanceReport) {
    section_heading(out, "environment");
    let environment = &report.environment;
    let simulated = if environment.simulated.is_empty() {
        "nothing".to_owned()
    } else {
        let items: Vec<String> = environment
            .simulated
            .iter()
            .map(|note| format!("<li>{}</li>", escape(note)))
            .collect();
        format!("<ul class=\"plain\">{}</ul>", items.concat())
    };
    facts(
        out,
        &[
            ("Tier", escape(&environment.tier)),
            ("coderd", escape(&environment.coderd)),
            ("Simulated", simulated),
            ("Started at", escape(&report.started_at)),
            ("Duration", duration(report.duration_ms)),
            ("Schema", code(&report.schema)),
        ],
    );
}

fn manifest_set(out: &mut String, title: &str, set: &ManifestSet) {
    let _ = writeln!(out, "<h3>{}</h3>", escape(title));
    facts(
        out,
        &[
            ("Source", escape(&set.source)),
            ("sha256", code(&set.sha256)),
        ],
    );
    if !set.files.is_empty() {
        out.push_str("<table><thead><tr><th>File</th><th>sha256</th></tr></thead><tbody>\n");
        for file in &set.files {
            let _ = writeln!(
                out,
                "<tr><td class=\"mono\">{}</td><td class=\"mono\">{}</td></tr>",
                escape(&file.path),
                escape(&file.sha256)
            );
        }
        out.push_str("</tbody></table>\n");
    }
}

fn setup_section(out: &mut String, report: &ConformanceReport) {
    section_heading(out, "setup");
    let Some(setup) = &report.setup else {
        out.push_str(
            "<p class=\"muted\">This report does not record its setup (a suite from before it existed).</p>\n",
        );
        return;
    };
    out.push_str("<p class=\"muted\">How the run was set up: enough to repeat it, and to see any hand-made change.</p>\n");
    let command = match &setup.operator_command {
        Some(command) => format!("<pre>{}</pre>", escape(command)),
        None => "<span class=\"muted\">none: the operator was installed</span>".to_owned(),
    };
    let timeouts = &setup.timeouts;
    let mut timing = format!(
        "eventually {}, hold window {}, interval {}, reach-and-hold {}, hold observations {}",
        duration(timeouts.eventually_ms),
        duration(timeouts.hold_window_ms),
        duration(timeouts.interval_ms),
        timeouts.reach_and_hold,
        timeouts.hold_observations
    );
    if let Some(scale) = timeouts.timeout_scale {
        let _ = write!(timing, ", timeout scale {scale}");
    }
    if let Some(measured) = &timeouts.hold_window_measured {
        let _ = write!(
            timing,
            "; the hold window was measured: {}",
            escape(measured)
        );
    }
    facts(
        out,
        &[
            ("Tier", escape(&setup.tier)),
            ("Mode", escape(&setup.mode)),
            ("Operator command", command),
            ("Control-plane access", escape(&setup.control_plane_access)),
            ("Timeouts", timing),
            ("Retries", setup.retries.to_string()),
            ("Concurrency", setup.concurrency.to_string()),
        ],
    );
    manifest_set(out, "CRDs", &setup.crds);
    match &setup.rbac {
        Some(rbac) => manifest_set(out, "RBAC", rbac),
        None => out.push_str(
            "<h3>RBAC</h3><p class=\"muted\">none recorded: the operator was installed with its own</p>\n",
        ),
    }
    if let Some(extra) = &setup.extra_manifests {
        manifest_set(out, "Extra manifests", extra);
    }
}

fn suite_section(out: &mut String, report: &ConformanceReport) {
    section_heading(out, "suite");
    let suite = &report.suite;
    facts(
        out,
        &[
            ("Version", escape(&suite.version)),
            ("Commit", code(&suite.git_commit)),
            ("Feature files", or_dash(&suite.features_source)),
        ],
    );
    if !suite.features.is_empty() {
        let _ = writeln!(
            out,
            "<details><summary>{} feature file(s) and their sha256</summary>\
             <table><thead><tr><th>File</th><th>sha256</th></tr></thead><tbody>",
            suite.features.len()
        );
        for file in &suite.features {
            let _ = writeln!(
                out,
                "<tr><td class=\"mono\">{}</td><td class=\"mono\">{}</td></tr>",
                escape(&file.path),
                escape(&file.sha256)
            );
        }
        out.push_str("</tbody></table></details>\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::model::tests::{report, result};
    use crate::selection::NOT_SELECTED;

    /// The values of `attribute="…"` in `html`.
    fn attribute_values<'a>(html: &'a str, attribute: &str) -> Vec<&'a str> {
        let needle = format!("{attribute}=\"");
        html.match_indices(&needle)
            .map(|(at, _)| {
                let rest = &html[at + needle.len()..];
                &rest[..rest.find('"').expect("a closed attribute")]
            })
            .collect()
    }

    /// Every `href="#x"` has an `id="x"`, and no id is used twice.
    fn assert_links_resolve(html: &str) {
        let ids = attribute_values(html, "id");
        let unique: BTreeSet<&str> = ids.iter().copied().collect();
        assert_eq!(unique.len(), ids.len(), "duplicated ids: {ids:?}");
        let internal: Vec<&str> = attribute_values(html, "href")
            .into_iter()
            .filter_map(|href| href.strip_prefix('#'))
            .collect();
        assert!(!internal.is_empty());
        for target in internal {
            assert!(unique.contains(target), "href=\"#{target}\" has no id");
        }
    }

    /// A report with two passes, a failure blamed on R-KEY-4 with its diagnostics, a real skip
    /// and a scenario left out by --tags.
    fn sample() -> ConformanceReport {
        let mut failed = result(Some(Level::Core), Status::Failed);
        failed.line = 12;
        failed.scenario = "A rotated key is revoked".into();
        failed.reason = Some(
            "step \"Then the old key is revoked\" failed: key k-1 still listed after 30 s".into(),
        );
        failed.failed_step = Some(15);
        failed.diagnostics = Some("diagnostics/a-12-a-rotated-key-is-revoked".into());
        let mut skipped = result(Some(Level::Extended), Status::Skipped);
        skipped.line = 20;
        skipped.reason = Some("needs the fake coderd's fault injection (a real coderd)".into());
        let mut left_out = result(Some(Level::Core), Status::Skipped);
        left_out.line = 30;
        left_out.reason = Some(format!("{NOT_SELECTED} --tags"));
        let mut passed = result(Some(Level::Core), Status::Passed);
        passed.line = 40;
        let mut extended = result(Some(Level::Extended), Status::Passed);
        extended.line = 50;
        report(vec![passed, failed, skipped, left_out, extended])
    }

    #[test]
    fn a_report_renders_every_section() {
        let html = render(&sample());
        assert!(html.starts_with("<!DOCTYPE html>"));
        for (id, title) in SECTIONS {
            assert!(
                html.contains(&format!("<h2 id=\"{id}\">{title}</h2>")),
                "{id}"
            );
        }
        assert!(html.contains("<h1>Conformance report: ref"));
        assert!(html.contains("<dt>Mode</dt><dd>reference</dd>"));
        assert!(html.contains("id=\"rule-R-KEY-4\""));
        assert!(html.contains("coder-provisioner-operator run"));
        assert!(html.contains("(matches the content)"));
    }

    #[test]
    fn every_internal_link_resolves_to_an_id() {
        assert_links_resolve(&render(&sample()));
        assert_links_resolve(&render(&report(vec![])));
        // Rule and scenario ids that slug alike still get distinct anchors.
        let mut odd = sample();
        let mut twin = odd.coverage[0].clone();
        twin.rule = "R KEY 4".into();
        odd.coverage.push(twin);
        odd.results[1].feature = "a b.feature".into();
        odd.results[0].feature = "a-b.feature".into();
        odd.results[0].line = odd.results[1].line;
        assert_links_resolve(&render(&odd));
        // Duplicated rows (an invalid report) do not duplicate ids.
        let mut doubled = sample();
        doubled.coverage.push(doubled.coverage[0].clone());
        doubled.results.push(doubled.results[0].clone());
        assert_links_resolve(&render(&doubled));
    }

    #[test]
    fn the_page_is_self_contained() {
        let html = render(&sample());
        for forbidden in ["<script", "<link", "<img", "@import", "url(", "src="] {
            assert!(!html.contains(forbidden), "{forbidden}");
        }
    }

    #[test]
    fn text_is_escaped() {
        let mut hostile = sample();
        hostile.implementation.name = "<script>alert(1)</script> & co".into();
        hostile.results[1].reason = Some("expected <b>\"x\"</b> & 'y'".into());
        hostile.results[1].diagnostics = Some("javascript:alert(1)".into());
        hostile.results[2].reason = Some("<script>boom</script>".into());
        let html = render(&hostile);
        assert!(!html.contains("<script"), "unescaped script tag");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt; &amp; co"));
        assert!(html.contains("expected &lt;b&gt;&quot;x&quot;&lt;/b&gt; &amp; &#39;y&#39;"));
        assert!(html.contains("&lt;script&gt;boom&lt;/script&gt;"));
        assert!(html.contains("href=\"./javascript%3Aalert%281%29/\""));
        assert!(!html.contains("href=\"javascript"));
        assert_eq!(escape("a&b<c>\"'"), "a&amp;b&lt;c&gt;&quot;&#39;");
    }

    #[test]
    fn a_failure_shows_its_message_blame_and_diagnostics() {
        let html = render(&sample());
        let failure = &html[html.find("<article class=\"failure\">").expect("a failure")..];
        let failure = &failure[..failure.find("</article>").unwrap()];
        assert!(failure.contains("A rotated key is revoked"));
        assert!(failure.contains(
            "step &quot;Then the old key is revoked&quot; failed: key k-1 still listed after 30 s"
        ));
        assert!(failure.contains("<code>a.feature:15</code>"), "{failure}");
        assert!(
            failure.contains("<dt>Blamed rules</dt><dd><a href=\"#rule-R-KEY-4\">R-KEY-4</a></dd>"),
            "{failure}"
        );
        assert!(failure.contains(
            "<a href=\"./diagnostics/a-12-a-rotated-key-is-revoked/\">diagnostics/a-12-a-rotated-key-is-revoked/</a>"
        ));
        // A rule outside the coverage is named without a link that would not resolve.
        let mut outside = sample();
        outside.results[1].failed_rules.push("R-NEW-1".into());
        let html = render(&outside);
        assert!(html.contains(", R-NEW-1</dd>"));
        assert_links_resolve(&html);
    }

    #[test]
    fn skips_show_their_reason_and_the_claims_say_why_not() {
        let html = render(&sample());
        let skipped = &html
            [html.find("<h2 id=\"skipped\">").unwrap()..html.find("<h2 id=\"rules\">").unwrap()];
        assert!(skipped.contains("needs the fake coderd&#39;s fault injection (a real coderd)"));
        assert!(skipped.contains("1 scenario(s) not run"));
        assert!(skipped.contains("not selected by --tags"));
        // A Core failure: no, saying how many failed.
        assert!(html.contains(
            "Core conformance</div><div class=\"verdict\">no</div><div>1 Core scenario failed"
        ));

        // A real skip and no failure: no, because of the skip.
        let mut gap = result(Some(Level::Core), Status::Skipped);
        gap.reason = Some("needs the fake coderd".into());
        let html = render(&report(vec![
            result(Some(Level::Core), Status::Passed),
            gap,
        ]));
        assert!(html.contains(
            "<div class=\"verdict\">no</div><div>1 scenario skipped, each with its reason"
        ));
        // A partial run: not claimed.
        let mut filtered = result(Some(Level::Core), Status::Skipped);
        filtered.reason = Some(format!("{NOT_SELECTED} --name"));
        let html = render(&report(vec![
            result(Some(Level::Core), Status::Passed),
            filtered,
        ]));
        assert!(html.contains(
            "<div class=\"verdict\">not claimed</div><div>a partial run: 1 scenario not run"
        ));
        // A full pass: yes.
        let html = render(&report(vec![
            result(Some(Level::Core), Status::Passed),
            result(Some(Level::Extended), Status::Passed),
        ]));
        assert!(html.contains("Core conformance</div><div class=\"verdict\">yes</div>"));
        assert!(html.contains("Extended conformance</div><div class=\"verdict\">yes</div>"));
    }

    #[test]
    fn a_stopped_run_and_an_edited_report_say_so() {
        let mut stopped = sample();
        stopped.aborted = Some("the control-plane fixture was changed".into());
        let stopped = stopped.seal().unwrap();
        let html = render(&stopped);
        assert!(html.contains(
            "The run was stopped before its end:</strong> the control-plane fixture was changed"
        ));
        let mut edited = sample();
        edited.results[0].duration_ms += 1;
        assert!(render(&edited).contains("does not match the content"));
    }

    #[test]
    fn the_default_page_is_beside_the_yaml() {
        assert_eq!(
            beside(Path::new("reports/conformance-report.yaml")),
            Path::new("reports/report.html")
        );
    }
}
