//! kplug's `Server-Timing` header (`api::timing` in the apiserver), read
//! back: the stages of a reconcile as kplug measured them.

use std::time::Duration;

use anyhow::{Context, Result};

/// The stages in `value` (`auth;dur=0.012, read;dur=0.004, ...`), in
/// order, with their durations.
pub fn parse(value: &str) -> Result<Vec<(String, Duration)>> {
    value
        .split(", ")
        .map(|metric| {
            let (name, milliseconds) = metric
                .split_once(";dur=")
                .with_context(|| format!("{metric:?} in {value:?} is not NAME;dur=MS"))?;
            let milliseconds: f64 = milliseconds
                .parse()
                .with_context(|| format!("the duration of {metric:?} in {value:?}"))?;
            let duration = Duration::try_from_secs_f64(milliseconds / 1e3)
                .with_context(|| format!("the duration of {metric:?} in {value:?}"))?;
            Ok((name.to_owned(), duration))
        })
        .collect()
}

/// The stages of the answer whose headers `kubectl -v=8` printed in
/// `log` (its stderr).
pub fn from_kubectl_log(log: &str) -> Result<Vec<(String, Duration)>> {
    let value = log
        .lines()
        .find_map(|line| line.trim().split_once("Server-Timing: "))
        .map(|(_, value)| value)
        .with_context(|| format!("no Server-Timing header in:\n{log}"))?;
    parse(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_in_order_with_their_durations() {
        let stages = parse("auth;dur=0.021, plugin;dur=40.125").expect("parses");
        assert_eq!(
            stages,
            [
                ("auth".to_owned(), Duration::from_micros(21)),
                ("plugin".to_owned(), Duration::from_micros(40_125)),
            ]
        );
        for bad in ["auth", "auth;dur=x", "auth;dur=-1", ""] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
