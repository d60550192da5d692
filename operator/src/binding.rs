//! Which implementation an object is bound to, and what that asks of the
//! next delegation. The binding lives in the object's
//! `status.implementation`.

use std::fmt;
use std::str::FromStr;

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
    fn policies_parse_by_their_names() {
        for policy in [BindingPolicy::Sticky, BindingPolicy::FollowSelection] {
            assert_eq!(policy.to_string().parse::<BindingPolicy>(), Ok(policy));
        }
        assert!("sticky".parse::<BindingPolicy>().is_err());
    }
}
