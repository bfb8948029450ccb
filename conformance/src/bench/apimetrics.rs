//! Counting Kubernetes API requests and writes from kube-apiserver's own `apiserver_request_total`
//! counter.
//!
//! The counter has no user label, so writes are attributed by what was written: the readiness
//! stand-in only patches `deployments/status`, the API server renews its own `leases`, `*reviews`
//! are not stored, and the bench subtracts the writes it made itself (the CoderProvisioner
//! creates). Everything else written during a phase is the operator's.
use std::collections::BTreeMap;

use anyhow::Context as _;

/// The verbs (as kube-apiserver labels them) that change stored state.
pub const WRITE_VERBS: [&str; 6] = [
    "POST",
    "PUT",
    "PATCH",
    "APPLY",
    "DELETE",
    "DELETECOLLECTION",
];
const REQUEST_COUNTER: &str = "apiserver_request_total";

/// One kind of request: verb and resource (`coderprovisioners/status` for a subresource); a
/// server-side dry run is its own verb (`APPLY (dry run)`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestKind {
    pub verb: String,
    pub resource: String,
}

impl RequestKind {
    pub fn new(verb: &str, resource: &str) -> Self {
        Self {
            verb: verb.to_owned(),
            resource: resource.to_owned(),
        }
    }

    /// `PATCH coderprovisioners/status`
    pub fn label(&self) -> String {
        format!("{} {}", self.verb, self.resource)
    }
}

/// Who made a write, judged from its kind (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writer {
    /// The suite's Deployment readiness stand-in (contract D-8).
    ReadinessSimulator,
    /// kube-apiserver itself (identity leases) or requests that store nothing.
    System,
    /// The operator, or the bench itself (subtracted separately).
    OperatorOrBench,
}

pub fn writer_of(kind: &RequestKind) -> Writer {
    match kind.resource.as_str() {
        "deployments/status" => Writer::ReadinessSimulator,
        "leases" => Writer::System,
        r if r.ends_with("reviews") => Writer::System,
        _ => Writer::OperatorOrBench,
    }
}

/// Cumulative request counts by kind, as read from one `/metrics` scrape.
pub type RequestCounts = BTreeMap<RequestKind, u64>;
/// [`RequestCounts`] of the write verbs only, dry runs left out (they store nothing).
pub type WriteCounts = RequestCounts;

/// Sums `apiserver_request_total` over response codes and other labels, by verb and resource.
pub fn parse_request_counts(metrics_text: &str) -> RequestCounts {
    let mut counts = RequestCounts::new();
    for line in metrics_text.lines() {
        let Some((name, labels, value)) = parse_sample(line) else {
            continue;
        };
        if name != REQUEST_COUNTER {
            continue;
        }
        let label = |key: &str| labels.get(key).map(String::as_str).unwrap_or("");
        let verb = match label("dry_run") {
            "" => label("verb").to_owned(),
            _ => format!("{} (dry run)", label("verb")),
        };
        let resource = match label("subresource") {
            "" => label("resource").to_owned(),
            sub => format!("{}/{sub}", label("resource")),
        };
        *counts
            .entry(RequestKind::new(&verb, &resource))
            .or_default() += value as u64;
    }
    counts
}

/// The writes among `requests`.
pub fn write_counts(requests: &RequestCounts) -> WriteCounts {
    requests
        .iter()
        .filter(|(kind, _)| WRITE_VERBS.contains(&kind.verb.as_str()))
        .map(|(kind, n)| (kind.clone(), *n))
        .collect()
}

/// The increase of each kind from `before` to `after`.
pub fn increase(before: &RequestCounts, after: &RequestCounts) -> RequestCounts {
    after
        .iter()
        .filter_map(|(kind, total)| {
            let delta = total.saturating_sub(before.get(kind).copied().unwrap_or(0));
            (delta > 0).then(|| (kind.clone(), delta))
        })
        .collect()
}

/// Writes attributed to the operator between two scrapes: the increase of every
/// [`Writer::OperatorOrBench`] kind minus the writes the bench made itself.
pub fn operator_writes(
    before: &WriteCounts,
    after: &WriteCounts,
    by_bench: &WriteCounts,
) -> WriteCounts {
    after
        .iter()
        .filter(|(kind, _)| writer_of(kind) == Writer::OperatorOrBench)
        .filter_map(|(kind, total)| {
            let earlier = before.get(kind).copied().unwrap_or(0);
            let own = by_bench.get(kind).copied().unwrap_or(0);
            let delta = total.saturating_sub(earlier).saturating_sub(own);
            (delta > 0).then(|| (kind.clone(), delta))
        })
        .collect()
}

/// Sum of all samples of `counter` (any labels) in a Prometheus/OpenMetrics text.
pub fn counter_sum(metrics_text: &str, counter: &str) -> Option<f64> {
    let values: Vec<f64> = metrics_text
        .lines()
        .filter_map(parse_sample)
        .filter(|(name, _, _)| *name == counter)
        .map(|(_, _, value)| value)
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// `name{a="x",b="y"} 12` → (name, labels, value); `None` for comments and malformed lines.
pub fn parse_sample(line: &str) -> Option<(&str, BTreeMap<String, String>, f64)> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let name = &line[..name_end];
    let mut labels = BTreeMap::new();
    let mut rest = &line[name_end..];
    if let Some(inner) = rest.strip_prefix('{') {
        let (parsed, after) = parse_labels(inner)?;
        labels = parsed;
        rest = after;
    }
    let value = rest.split_whitespace().next()?.parse::<f64>().ok()?;
    Some((name, labels, value))
}

/// Parses `a="x",b="y\"z"}` and returns the labels and what follows the closing brace.
fn parse_labels(mut text: &str) -> Option<(BTreeMap<String, String>, &str)> {
    let mut labels = BTreeMap::new();
    loop {
        text = text.trim_start_matches([',', ' ']);
        if let Some(after) = text.strip_prefix('}') {
            return Some((labels, after));
        }
        let eq = text.find('=')?;
        let key = text[..eq].trim().to_owned();
        let mut chars = text[eq + 1..].char_indices();
        if chars.next()?.1 != '"' {
            return None;
        }
        let mut value = String::new();
        let mut escaped = false;
        let mut end = None;
        for (i, c) in chars {
            match (escaped, c) {
                (true, 'n') => {
                    value.push('\n');
                    escaped = false;
                }
                (true, c) => {
                    value.push(c);
                    escaped = false;
                }
                (false, '\\') => escaped = true,
                (false, '"') => {
                    end = Some(i);
                    break;
                }
                (false, c) => value.push(c),
            }
        }
        text = &text[eq + 1 + end? + 1..];
        labels.insert(key, value);
    }
}

/// What one `/metrics` scrape tells the bench.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ApiScrape {
    pub writes: WriteCounts,
    /// Every request any client made (all verbs), for the load on the API server.
    pub requests: RequestCounts,
}

impl ApiScrape {
    pub fn total_requests(&self) -> u64 {
        self.requests.values().sum()
    }
}

pub fn parse_scrape(metrics_text: &str) -> ApiScrape {
    let requests = parse_request_counts(metrics_text);
    ApiScrape {
        writes: write_counts(&requests),
        requests,
    }
}

/// Scrapes kube-apiserver's `/metrics` with `client` (needs the `/metrics` non-resource right).
pub async fn scrape(client: &kube::Client) -> anyhow::Result<ApiScrape> {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .context("building the /metrics request")?;
    let text = client
        .request_text(request)
        .await
        .context("scraping kube-apiserver /metrics")?;
    Ok(parse_scrape(&text))
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    const SCRAPE: &str = r#"# HELP apiserver_request_total [STABLE] Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",dry_run="",group="coder.com",resource="coderprovisioners",scope="resource",subresource="",verb="POST",version="v1alpha1"} 10
apiserver_request_total{code="200",component="apiserver",dry_run="",group="coder.com",resource="coderprovisioners",scope="resource",subresource="status",verb="PATCH",version="v1alpha1"} 7
apiserver_request_total{code="409",component="apiserver",dry_run="",group="coder.com",resource="coderprovisioners",scope="resource",subresource="status",verb="PATCH",version="v1alpha1"} 1
apiserver_request_total{code="200",component="apiserver",dry_run="",group="apps",resource="deployments",scope="resource",subresource="status",verb="PATCH",version="v1"} 5
apiserver_request_total{code="200",component="apiserver",dry_run="",group="apps",resource="deployments",scope="resource",subresource="",verb="APPLY",version="v1"} 4
apiserver_request_total{code="200",component="apiserver",dry_run="All",group="apps",resource="deployments",scope="resource",subresource="",verb="APPLY",version="v1"} 9
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="secrets",scope="resource",subresource="",verb="GET",version="v1"} 99
apiserver_request_total{code="200",component="apiserver",dry_run="",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PUT",version="v1"} 3
apiserver_request_total{code="201",component="apiserver",dry_run="",group="authorization.k8s.io",resource="subjectaccessreviews",scope="resource",subresource="",verb="POST",version="v1"} 2
apiserver_request_duration_seconds_count{verb="POST"} 1000
"#;

    #[test]
    fn write_counts_sum_codes_and_skip_reads_and_dry_runs() {
        let counts = write_counts(&parse_request_counts(SCRAPE));
        assert_eq!(
            counts.get(&RequestKind::new("POST", "coderprovisioners")),
            Some(&10)
        );
        assert_eq!(
            counts.get(&RequestKind::new("PATCH", "coderprovisioners/status")),
            Some(&8)
        );
        assert_eq!(
            counts.get(&RequestKind::new("APPLY", "deployments")),
            Some(&4)
        );
        assert!(!counts.keys().any(|k| k.verb == "GET"));
        assert_eq!(counts.len(), 6);
    }

    #[test]
    fn a_scrape_counts_every_request_too() {
        let scrape = parse_scrape(SCRAPE);
        assert_eq!(scrape.total_requests(), 10 + 7 + 1 + 5 + 4 + 9 + 99 + 3 + 2);
        assert_eq!(
            scrape.requests[&RequestKind::new("APPLY (dry run)", "deployments")],
            9,
            "a dry run is a request of its own kind"
        );
        assert_eq!(scrape.requests[&RequestKind::new("GET", "secrets")], 99);
        assert_eq!(scrape.writes, write_counts(&scrape.requests));
        assert_eq!(
            increase(&parse_request_counts(""), &scrape.requests),
            scrape.requests
        );
        assert!(increase(&scrape.requests, &scrape.requests).is_empty());
    }

    #[test]
    fn operator_writes_exclude_the_simulator_the_system_and_the_bench() {
        let before = WriteCounts::new();
        let after = parse_scrape(SCRAPE).writes;
        let bench = WriteCounts::from([(RequestKind::new("POST", "coderprovisioners"), 10)]);
        let writes = operator_writes(&before, &after, &bench);
        assert_eq!(
            writes,
            WriteCounts::from([
                (RequestKind::new("APPLY", "deployments"), 4),
                (RequestKind::new("PATCH", "coderprovisioners/status"), 8),
            ])
        );
        assert!(operator_writes(&after, &after, &WriteCounts::new()).is_empty());
    }

    #[rstest]
    #[case("deployments/status", Writer::ReadinessSimulator)]
    #[case("leases", Writer::System)]
    #[case("tokenreviews", Writer::System)]
    #[case("deployments", Writer::OperatorOrBench)]
    #[case("coderprovisioners/status", Writer::OperatorOrBench)]
    #[case("events", Writer::OperatorOrBench)]
    fn writers_are_told_apart_by_resource(#[case] resource: &str, #[case] writer: Writer) {
        assert_eq!(writer_of(&RequestKind::new("PATCH", resource)), writer);
    }

    #[rstest]
    #[case("up 1", Some(("up", 0, 1.0)))]
    #[case(r#"x_total{result="ok"} 3"#, Some(("x_total", 1, 3.0)))]
    #[case(r#"x{a="q\"uote,}",b="2"} 4.5 1700000000"#, Some(("x", 2, 4.5)))]
    #[case("# TYPE x counter", None)]
    #[case("", None)]
    #[case(r#"x{a="unterminated} 1"#, None)]
    #[case("x notanumber", None)]
    fn samples_parse(#[case] line: &str, #[case] expected: Option<(&str, usize, f64)>) {
        let parsed = parse_sample(line).map(|(name, labels, value)| (name, labels.len(), value));
        assert_eq!(parsed, expected);
    }

    #[test]
    fn escaped_label_values_are_unescaped() {
        let (_, labels, _) = parse_sample(r#"x{a="q\"uote,}"} 1"#).expect("sample");
        assert_eq!(labels["a"], "q\"uote,}");
    }

    #[test]
    fn counters_sum_over_labels() {
        let text =
            "# HELP r x\nr_total{result=\"ok\"} 3\nr_total{result=\"error\"} 2\nother_total 9\n";
        assert_eq!(counter_sum(text, "r_total"), Some(5.0));
        assert_eq!(counter_sum(text, "missing_total"), None);
    }
}
