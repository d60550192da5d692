//! The label selector: its requirements and how they match a set of labels.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use super::SelectorError;
use super::parser::Parser;

/// A parsed label selector (`?labelSelector=`).
///
/// Supports everything apimachinery's `labels.Parse` does: `k=v`, `k==v`,
/// `k!=v`, `k in (v1,v2)`, `k notin (v1)`, `k`, `!k`, and the integer
/// comparisons `k>n` and `k<n` (which never match an absent or non-integer
/// label). `!=` and `notin` match objects without the key. The one departure
/// is that `k in ()` is rejected, where apimachinery reads it as `k in ("")`;
/// empty list elements, as in `k in (a,)`, still stand for the empty value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// Parses the Kubernetes string form. Empty string selects everything.
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut requirements = Parser::new(s).selector()?;
        // Sorted by key, as apimachinery does.
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(Self { requirements })
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.matches_with(|key| labels.get(key).map(String::as_str))
    }

    /// Whether the labels that `label` looks up satisfy every requirement.
    pub fn matches_with<'a>(&self, label: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.requirements.iter().all(|r| r.matches(label(&r.key)))
    }

    /// Whether the selector selects everything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }
}

/// The Kubernetes string form, which [`LabelSelector::parse`] reads back as
/// the same requirements (as apimachinery's `String()`).
impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, requirement) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{requirement}")?;
        }
        Ok(())
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = &self.key;
        let set = |values: &BTreeSet<String>| values.iter().cloned().collect::<Vec<_>>().join(",");
        match &self.op {
            Op::Exists => write!(f, "{key}"),
            Op::DoesNotExist => write!(f, "!{key}"),
            Op::In(values) if values.len() == 1 => write!(f, "{key}={}", set(values)),
            Op::In(values) => write!(f, "{key} in ({})", set(values)),
            Op::NotIn(values) if values.len() == 1 => write!(f, "{key}!={}", set(values)),
            Op::NotIn(values) => write!(f, "{key} notin ({})", set(values)),
            Op::Gt(bound) => write!(f, "{key}>{bound}"),
            Op::Lt(bound) => write!(f, "{key}<{bound}"),
        }
    }
}

impl FromStr for LabelSelector {
    type Err = SelectorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// One comma-separated term of a label selector, as the parser builds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Requirement {
    pub(super) key: String,
    pub(super) op: Op,
}

/// What a requirement asks of its key's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Op {
    Exists,
    DoesNotExist,
    /// `=`, `==` and `in`.
    In(BTreeSet<String>),
    /// `!=` and `notin`.
    NotIn(BTreeSet<String>),
    Gt(i64),
    Lt(i64),
}

impl Requirement {
    fn matches(&self, value: Option<&str>) -> bool {
        match (&self.op, value) {
            (Op::Exists, value) => value.is_some(),
            (Op::DoesNotExist, value) => value.is_none(),
            (Op::In(values), Some(value)) => values.contains(value),
            (Op::NotIn(values), Some(value)) => !values.contains(value),
            (Op::NotIn(_), None) => true,
            (Op::Gt(bound), Some(value)) => value.parse::<i64>().is_ok_and(|v| v > *bound),
            (Op::Lt(bound), Some(value)) => value.parse::<i64>().is_ok_and(|v| v < *bound),
            (Op::In(_) | Op::Gt(_) | Op::Lt(_), None) => false,
        }
    }
}
