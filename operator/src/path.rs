//! Dotted field paths into an object, e.g. `spec.extensions`: how the
//! zero-code operator is told where a resource keeps its extension
//! references and its preferred implementation.

use std::fmt;
use std::str::FromStr;

use serde_json::Value;

/// A path of object keys, written `spec.preferredImplementation`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldPath(Vec<String>);

/// Why a path could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid field path {path:?}: {why}")]
pub struct FieldPathError {
    path: String,
    why: &'static str,
}

impl FieldPath {
    /// A path written in the code, known to be well-formed.
    pub(crate) fn parse_static(path: &'static str) -> Self {
        Self(path.split('.').map(str::to_owned).collect())
    }

    /// The value at this path, if every step exists.
    pub fn get<'a>(&self, object: &'a Value) -> Option<&'a Value> {
        self.0.iter().try_fold(object, |value, key| value.get(key))
    }
}

impl FromStr for FieldPath {
    type Err = FieldPathError;

    fn from_str(path: &str) -> Result<Self, Self::Err> {
        let error = |why| FieldPathError {
            path: path.to_owned(),
            why,
        };
        let path = path.strip_prefix('.').unwrap_or(path);
        if path.is_empty() {
            return Err(error("it is empty"));
        }
        let keys: Vec<String> = path.split('.').map(str::to_owned).collect();
        if keys.iter().any(String::is_empty) {
            return Err(error(
                "it has an empty step (two dots in a row, or a trailing dot)",
            ));
        }
        Ok(Self(keys))
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join("."))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn paths_parse_and_read() {
        let path: FieldPath = "spec.preferredImplementation".parse().expect("valid");
        assert_eq!(path.to_string(), "spec.preferredImplementation");
        let object = json!({"spec": {"preferredImplementation": "MariaDB"}});
        assert_eq!(path.get(&object), Some(&json!("MariaDB")));
        assert_eq!(path.get(&json!({"spec": {}})), None);
        assert_eq!(path.get(&json!({"spec": "text"})), None);
        let jsonpath_style: FieldPath = ".spec.extensions".parse().expect("valid");
        assert_eq!(jsonpath_style.to_string(), "spec.extensions");
    }

    #[test]
    fn malformed_paths_are_refused() {
        for bad in ["", ".", "spec..extensions", "spec."] {
            assert!(bad.parse::<FieldPath>().is_err(), "{bad:?}");
        }
    }
}
