//! The `Server-Timing` header (W3C Server Timing) of a reconcile's answer:
//! how long each stage of kplug's handling took, measured as it ended, so
//! that a caller (`curl -v`, `kubectl -v=8`, the reconcile bench) can tell
//! kplug's part of a call from the network's and the plugin's.
//!
//! A stage's `dur` is in milliseconds, as the header defines it. The stages,
//! in order: `auth` (authentication and authorization), `read` (from then
//! until the handler runs: reading the body, routing), `decode`, `select`
//! (validation and the plugin's selection), `objectRef` (reading the objects
//! a reconcile by reference names, only then), `checks` (the object checks
//! and the capability), `plugin` (kplug's gRPC call, from sending the
//! request to decoding the answer) and `answer` (rendering the Reconcile).
//! What the caller measures beyond their sum is the connection's: TLS,
//! HTTP/2 and the network, both ways.

use std::fmt::Write;
use std::time::{Duration, Instant};

use axum::http::HeaderValue;

/// How long a request's authentication took and when it ended: set by the
/// server's guard for the handlers.
#[derive(Clone, Copy, Debug)]
pub struct Authenticated {
    pub took: Duration,
    pub at: Instant,
}

/// The stages of one request, each measured from the end of the one before.
#[derive(Debug)]
pub struct Stages {
    last: Instant,
    ended: Vec<(&'static str, Duration)>,
}

impl Stages {
    /// Starts at the handler, with `auth` and `read` when the guard said
    /// when authentication ended.
    pub fn start(authenticated: Option<Authenticated>) -> Self {
        let now = Instant::now();
        let mut ended = Vec::with_capacity(8);
        if let Some(Authenticated { took, at }) = authenticated {
            ended.push(("auth", took));
            ended.push(("read", now.saturating_duration_since(at)));
        }
        Self { last: now, ended }
    }

    /// Ends `stage` now.
    pub fn end(&mut self, stage: &'static str) {
        let now = Instant::now();
        self.ended
            .push((stage, now.saturating_duration_since(self.last)));
        self.last = now;
    }

    /// The header's value: `auth;dur=0.012, read;dur=0.004, ...`.
    pub fn header(&self) -> Option<HeaderValue> {
        let mut value = String::with_capacity(self.ended.len() * 20);
        for (i, (stage, took)) in self.ended.iter().enumerate() {
            let separator = if i == 0 { "" } else { ", " };
            // Milliseconds to the microsecond, what the stages differ by,
            // written as integers: formatting floats cost a reconcile a few
            // microseconds more.
            let micros = took.as_micros();
            let _ = write!(
                value,
                "{separator}{stage};dur={}.{:03}",
                micros / 1000,
                micros % 1000
            );
        }
        HeaderValue::from_str(&value).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_follow_each_other_and_read_as_server_timing() {
        let authenticated = Authenticated {
            took: Duration::from_micros(21),
            at: Instant::now(),
        };
        let mut stages = Stages::start(Some(authenticated));
        std::thread::sleep(Duration::from_millis(2));
        stages.end("decode");
        stages.end("plugin");
        let header = stages.header().expect("a header value");
        let text = header.to_str().expect("ASCII");
        let parsed: Vec<(&str, f64)> = text
            .split(", ")
            .map(|metric| {
                let (name, duration) = metric.split_once(";dur=").expect("name;dur=ms");
                (name, duration.parse().expect("milliseconds"))
            })
            .collect();
        let names: Vec<&str> = parsed.iter().map(|(name, _)| *name).collect();
        assert_eq!(names, ["auth", "read", "decode", "plugin"], "{text}");
        assert_eq!(parsed[0].1, 0.021, "{text}");
        assert!(parsed[2].1 >= 2.0, "the sleep is in decode: {text}");
        assert!(parsed[3].1 < parsed[2].1, "{text}");
    }

    #[test]
    fn without_the_guard_the_stages_start_at_the_handler() {
        let mut stages = Stages::start(None);
        stages.end("decode");
        let header = stages.header().expect("a header value");
        assert!(
            header.to_str().expect("ASCII").starts_with("decode;dur="),
            "{header:?}"
        );
    }
}
