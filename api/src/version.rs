//! Version constraints: which releases of a plugin may serve a request.
//!
//! A constraint is a semver range in Cargo's syntax (`>=1.4, <2`, `^1.4`,
//! `~1.4.2`, `1.*`); a version matches it as semver says, so a
//! pre-release matches only a comparator that names a pre-release of the
//! same `major.minor.patch`. A plugin version that is not semver (after
//! dropping a leading `v`) matches no constraint.

use std::fmt;
use std::str::FromStr;

/// A parsed `versionConstraint`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VersionConstraint {
    text: String,
    range: semver::VersionReq,
}

/// Why a constraint does not parse, in semver's words.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConstraintError(String);

impl FromStr for VersionConstraint {
    type Err = ConstraintError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let range = semver::VersionReq::parse(text.trim())
            .map_err(|e| ConstraintError(format!("not a semver range ({e})")))?;
        Ok(Self {
            text: text.trim().to_owned(),
            range,
        })
    }
}

impl VersionConstraint {
    /// Whether `version` (a plugin's declared release) is in range.
    pub fn matches(&self, version: &str) -> bool {
        release(version).is_some_and(|v| self.range.matches(&v))
    }
}

/// A plugin's declared release as semver, after a leading `v`.
fn release(version: &str) -> Option<semver::Version> {
    semver::Version::parse(version.strip_prefix('v').unwrap_or(version)).ok()
}

/// The major version of a plugin's declared release, when it is semver.
pub fn major(version: &str) -> Option<u64> {
    release(version).map(|v| v.major)
}

impl fmt::Display for VersionConstraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn constraint(text: &str) -> VersionConstraint {
        text.parse().expect("a valid constraint")
    }

    #[test]
    fn versions_match_as_semver_says() {
        let range = constraint(">=1.4, <2");
        for (version, matches) in [
            ("1.4.0", true),
            ("v1.9.3", true),
            ("1.3.9", false),
            ("2.0.0", false),
            ("2.0.0-rc.1", false),
            ("1.5.0-rc.1", false),
            ("unversioned", false),
            ("1.5", false),
        ] {
            assert_eq!(range.matches(version), matches, "{version}");
        }
        assert!(constraint("^2.0.0-rc.1").matches("2.0.0-rc.2"));
        assert_eq!(major("v2.0.1"), Some(2));
        assert_eq!(major("1.5"), None);
        assert_eq!(range.to_string(), ">=1.4, <2");
    }

    #[test]
    fn what_is_not_a_range_says_why() {
        for text in ["", "newest", ">=1.4,, <2", "1.x.y"] {
            let error = text.parse::<VersionConstraint>().expect_err("not a range");
            assert!(
                error.to_string().starts_with("not a semver range ("),
                "{error}"
            );
        }
    }
}
