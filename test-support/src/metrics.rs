//! Scraping a Prometheus endpoint as Prometheus would: an HTTPS GET with a
//! bearer token or a client certificate (curl, the independent client),
//! the answer read with the Prometheus project's strict OpenMetrics
//! parser, then samples looked up by name and labels.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, ensure};
use serde::Deserialize;

use crate::postgres::venv_python;

/// How a scrape authenticates.
#[derive(Clone, Copy, Debug)]
pub enum Credential<'a> {
    Anonymous,
    Bearer(&'a str),
    ClientCert { cert: &'a Path, key: &'a Path },
}

/// Which server certificate a scrape trusts.
#[derive(Clone, Copy, Debug)]
pub enum Trust<'a> {
    /// Only certificates signed by this CA (a PEM file).
    Ca(&'a Path),
    /// Any: a self-signed endpoint, as Prometheus's
    /// `insecure_skip_verify` scrapes it.
    Any,
}

/// GETs `url`: returns the HTTP status (0 when there was no answer) and
/// the body.
pub fn get(url: &str, trust: Trust<'_>, credential: Credential<'_>) -> (u16, String) {
    let mut command = Command::new("curl");
    command.args(["-sS", "--max-time", "10", "-w", "\n%{http_code}"]);
    match trust {
        Trust::Ca(ca) => {
            command.arg("--cacert").arg(ca);
        }
        Trust::Any => {
            command.arg("--insecure");
        }
    }
    match credential {
        Credential::Anonymous => {}
        Credential::Bearer(token) => {
            command.args(["-H", &format!("Authorization: Bearer {token}")]);
        }
        Credential::ClientCert { cert, key } => {
            command.arg("--cert").arg(cert).arg("--key").arg(key);
        }
    }
    let output = command.arg(url).output().expect("run curl");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let (body, code) = stdout.rsplit_once('\n').unwrap_or(("", &stdout));
    let body = if body.is_empty() && !output.status.success() {
        String::from_utf8_lossy(&output.stderr).into_owned()
    } else {
        body.to_owned()
    };
    (code.trim().parse().unwrap_or(0), body)
}

/// Parses the page with the Prometheus project's own strict OpenMetrics
/// parser and prints its families' help and every sample as JSON.
const PARSE: &str = r#"
import json, sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
families = list(text_string_to_metric_families(sys.stdin.read()))
json.dump({
    "help": {f.name: f.documentation for f in families},
    "samples": [
        {"name": s.name, "labels": s.labels, "value": s.value}
        for f in families for s in f.samples
    ],
}, sys.stdout)
"#;

/// One sample: a series and its value.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

#[derive(Deserialize)]
struct Parsed {
    help: BTreeMap<String, String>,
    samples: Vec<Sample>,
}

/// A parsed scrape.
#[derive(Debug)]
pub struct Samples {
    samples: Vec<Sample>,
    help: BTreeMap<String, String>,
    /// The text as served, for failure messages.
    pub text: String,
}

impl Samples {
    /// Parses the OpenMetrics text format strictly, with the Prometheus
    /// project's own parser (the `prometheus_client` Python package,
    /// installed by hack/python-env.sh): a page Prometheus would reject
    /// fails the test, not only wrong numbers.
    pub fn parse(text: &str) -> Self {
        Self::try_parse(text).unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// [`Samples::parse`] returning an error instead of panicking, for the
    /// benches.
    pub fn try_parse(text: &str) -> Result<Self> {
        let mut child = Command::new(venv_python())
            .args(["-c", PARSE])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("start the OpenMetrics parser (run hack/python-env.sh)")?;
        child
            .stdin
            .take()
            .context("the parser's stdin")?
            .write_all(text.as_bytes())
            .context("send the page to the parser")?;
        let output = child.wait_with_output().context("the parser's output")?;
        ensure!(
            output.status.success(),
            "not valid OpenMetrics: {}\n--- page ---\n{text}",
            String::from_utf8_lossy(&output.stderr)
        );
        let parsed: Parsed =
            serde_json::from_slice(&output.stdout).context("the parser prints JSON")?;
        Ok(Self {
            samples: parsed.samples,
            help: parsed.help,
            text: text.to_owned(),
        })
    }

    /// The samples named `name` (as exposed: a counter's `_total`, a
    /// histogram's `_count`, `_sum` or `_bucket`) whose labels include
    /// `labels`.
    pub fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |sample| {
            sample.name == name
                && labels
                    .iter()
                    .all(|(key, value)| sample.labels.get(*key).map(String::as_str) == Some(value))
        })
    }

    /// The value of the one sample [`Samples::matching`] finds; `None` when
    /// there is none. Panics when several match, naming them.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let matching: Vec<_> = self.matching(name, labels).collect();
        match matching.as_slice() {
            [] => None,
            [one] => Some(one.value),
            several => panic!(
                "{name} {labels:?} matches {} samples: {several:?}",
                several.len()
            ),
        }
    }

    /// Like [`Samples::value`], but the sample must be there.
    pub fn expect(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.value(name, labels)
            .unwrap_or_else(|| panic!("no sample {name} {labels:?} in\n{}", self.text))
    }

    /// The sum over [`Samples::matching`]; 0 when none match, as for a
    /// counter never incremented.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.matching(name, labels).map(|sample| sample.value).sum()
    }

    /// The HELP text of the metric family `name` (as registered, e.g.
    /// without a counter's `_total`).
    pub fn help(&self, name: &str) -> Option<&str> {
        self.help.get(name).map(String::as_str)
    }
}

/// GETs `url` and parses it; panics unless the answer is 200 with samples.
pub fn scrape(url: &str, trust: Trust<'_>, credential: Credential<'_>) -> Samples {
    let (status, body) = get(url, trust, credential);
    assert_eq!(status, 200, "scraping {url}: {body}");
    Samples::parse(&body)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP requests Requests served.
# TYPE requests counter
requests_total{code="200",method="get"} 7
requests_total{code="500",method="get"} 1
# HELP workers Workers busy.
# TYPE workers gauge
workers{pool="a"} 3
# HELP latency_seconds Latency.
# TYPE latency_seconds histogram
latency_seconds_sum{path="/x"} 0.5
latency_seconds_count{path="/x"} 4
latency_seconds_bucket{le="0.1",path="/x"} 3
latency_seconds_bucket{le="+Inf",path="/x"} 4
# EOF
"#;

    #[test]
    fn samples_are_found_by_name_and_labels() {
        let samples = Samples::parse(TEXT);
        assert_eq!(
            samples.value("requests_total", &[("code", "200"), ("method", "get")]),
            Some(7.0)
        );
        assert_eq!(
            samples.value("requests_total", &[("code", "500")]),
            Some(1.0)
        );
        assert_eq!(samples.value("requests_total", &[("code", "404")]), None);
        assert_eq!(samples.expect("workers", &[]), 3.0);
        assert_eq!(
            samples.expect("latency_seconds_count", &[("path", "/x")]),
            4.0
        );
        assert_eq!(samples.help("workers"), Some("Workers busy."));
        assert_eq!(samples.sum("requests_total", &[("method", "get")]), 8.0);
        assert_eq!(samples.sum("requests_total", &[("method", "put")]), 0.0);
    }

    #[test]
    #[should_panic(expected = "not valid OpenMetrics")]
    fn a_page_prometheus_would_reject_fails() {
        Samples::parse("requests_total{code=200} 7\n# EOF\n");
    }

    #[test]
    #[should_panic(expected = "matches 2 samples")]
    fn an_ambiguous_lookup_says_so() {
        Samples::parse(TEXT).value("requests_total", &[("method", "get")]);
    }
}
