//! Which implementation an object is bound to, and what that asks of the
//! next delegation. The binding lives in the object's
//! `status.implementation`, with the major version of the release that
//! served it in `status.majorVersion`: a sticky object bound to 1.x is
//! never moved to 2.x until its binding is cleared.

use std::fmt;
use std::str::FromStr;

use kube::api::DynamicObject;
use serde_json::Value;

/// The implementation the object is bound to (`status.implementation`).
pub fn bound_implementation(object: &DynamicObject) -> Option<&str> {
    object
        .data
        .pointer("/status/implementation")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

/// The major version the object is bound to (`status.majorVersion`), while
/// it is bound to an implementation.
pub fn bound_major_version(object: &DynamicObject) -> Option<u64> {
    bound_implementation(object)?;
    object
        .data
        .pointer("/status/majorVersion")
        .and_then(Value::as_u64)
}

/// How an object's implementation is kept once chosen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BindingPolicy {
    /// Once a plugin of an implementation has served the object, only that
    /// implementation serves it: when none of its plugins is Ready the
    /// object waits with a condition, so its data never moves silently.
    /// Clearing `status.implementation` rebinds it.
    #[default]
    Sticky,
    /// Every reconcile goes wherever kplug's selection says, e.g. for
    /// stateless plugins. Finalize still goes to the last implementation.
    FollowSelection,
}

impl BindingPolicy {
    /// The implementation the next call must reach, if any.
    pub fn required(self, bound: Option<&str>, finalizing: bool) -> Option<&str> {
        match self {
            Self::Sticky => bound,
            Self::FollowSelection if finalizing => bound,
            Self::FollowSelection => None,
        }
    }
}

/// The version constraint of an object's next call: its own (`own`) or
/// else the operator's (`default`), narrowed to `bound_major` when its
/// binding holds one. Comparators joined with commas must all hold.
pub fn version_constraint(
    own: Option<&str>,
    default: Option<&str>,
    bound_major: Option<u64>,
) -> Option<String> {
    let major = bound_major.map(|m| format!(">={m}.0.0, <{}.0.0", m.saturating_add(1)));
    let asked = own.filter(|c| !c.trim().is_empty()).or(default);
    match (asked, major) {
        (Some(asked), Some(major)) => Some(format!("{asked}, {major}")),
        (asked, major) => asked.map(str::to_owned).or(major),
    }
}

impl FromStr for BindingPolicy {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "Sticky" => Ok(Self::Sticky),
            "FollowSelection" => Ok(Self::FollowSelection),
            other => Err(format!(
                "unsupported binding policy {other:?}: supported values: \"Sticky\", \"FollowSelection\""
            )),
        }
    }
}

impl fmt::Display for BindingPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Sticky => "Sticky",
            Self::FollowSelection => "FollowSelection",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sticky_requires_the_bound_implementation_and_follow_only_to_finalize() {
        assert_eq!(BindingPolicy::Sticky.required(None, false), None);
        assert_eq!(
            BindingPolicy::Sticky.required(Some("PostgreSQL"), false),
            Some("PostgreSQL")
        );
        assert_eq!(
            BindingPolicy::FollowSelection.required(Some("PostgreSQL"), false),
            None
        );
        assert_eq!(
            BindingPolicy::FollowSelection.required(Some("PostgreSQL"), true),
            Some("PostgreSQL")
        );
    }

    #[test]
    fn a_bound_major_narrows_the_objects_or_the_operators_constraint() {
        assert_eq!(version_constraint(None, None, None), None);
        assert_eq!(
            version_constraint(Some(">=1.4"), Some("^1"), None).as_deref(),
            Some(">=1.4"),
            "the object's own wins"
        );
        assert_eq!(
            version_constraint(Some(" "), Some("^1"), None).as_deref(),
            Some("^1")
        );
        assert_eq!(
            version_constraint(None, None, Some(1)).as_deref(),
            Some(">=1.0.0, <2.0.0")
        );
        let both = version_constraint(Some(">=1.4"), None, Some(1)).expect("a constraint");
        assert_eq!(both, ">=1.4, >=1.0.0, <2.0.0");
        let parsed: kplug_api::version::VersionConstraint = both.parse().expect("valid");
        assert!(parsed.matches("1.5.0") && !parsed.matches("2.0.0") && !parsed.matches("1.3.0"));
    }

    #[test]
    fn policies_parse_by_their_names() {
        for policy in [BindingPolicy::Sticky, BindingPolicy::FollowSelection] {
            assert_eq!(policy.to_string().parse::<BindingPolicy>(), Ok(policy));
        }
        assert!("sticky".parse::<BindingPolicy>().is_err());
    }
}
