//! References from one object to others, as resources write them: the
//! dotted field path where an object keeps them (`spec.extensions`) and the
//! references themselves (`apiVersion`, `kind`, `name`, optional
//! `namespace`). Parsed without IO, so that kplug (reconcile by reference),
//! the operator and `kubectl kplug` read an object's extensions alike.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
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
    pub fn parse_static(path: &'static str) -> Self {
        Self(path.split('.').map(str::to_owned).collect())
    }

    /// Where objects keep their extension references unless told otherwise.
    pub fn default_extensions() -> Self {
        Self::parse_static(DEFAULT_EXTENSIONS_PATH)
    }

    /// The value at this path, if every step exists.
    pub fn get<'a>(&self, object: &'a Value) -> Option<&'a Value> {
        self.0.iter().try_fold(object, |value, key| value.get(key))
    }
}

/// Where objects keep their extension references unless told otherwise.
pub const DEFAULT_EXTENSIONS_PATH: &str = "spec.extensions";

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

/// A reference to an extension object, as a resource writes it in e.g.
/// `spec.extensions`: `apiVersion`, `kind`, `name` and an optional
/// `namespace` that defaults to the referring object's.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExtensionRef {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

impl ExtensionRef {
    /// The group (empty for the core group) and version it names.
    pub fn group_version(&self) -> (&str, &str) {
        self.api_version
            .rsplit_once('/')
            .unwrap_or(("", self.api_version.as_str()))
    }
}

impl fmt::Display for ExtensionRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.api_version, self.kind)?;
        match &self.namespace {
            Some(namespace) => write!(f, " {namespace}/{}", self.name),
            None => write!(f, " {}", self.name),
        }
    }
}

/// What is wrong with an object's extension references.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceError {
    #[error("{field} must be a list of object references, not {found}")]
    NotAList { field: String, found: &'static str },
    #[error("{field}[{index}] is not a valid object reference: {why}")]
    InvalidReference {
        field: String,
        index: usize,
        why: String,
    },
}

/// What `value` is, in words for a message: "a list", "an object", ...
pub fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Parses the references at `field` (`None`: the object has none).
pub fn parse_references(
    field: &str,
    value: Option<&Value>,
) -> Result<Vec<ExtensionRef>, ReferenceError> {
    let items = match value {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(other) => {
            return Err(ReferenceError::NotAList {
                field: field.to_owned(),
                found: type_name(other),
            });
        }
    };
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            let invalid = |why: String| ReferenceError::InvalidReference {
                field: field.to_owned(),
                index,
                why,
            };
            let reference = ExtensionRef::deserialize(item).map_err(|e| invalid(e.to_string()))?;
            for (name, value) in [
                ("apiVersion", &reference.api_version),
                ("kind", &reference.kind),
                ("name", &reference.name),
            ] {
                if value.is_empty() {
                    return Err(invalid(format!("{name} must not be empty")));
                }
            }
            if reference.api_version.matches('/').count() > 1 {
                return Err(invalid(format!(
                    "apiVersion {:?} must be GROUP/VERSION or VERSION",
                    reference.api_version
                )));
            }
            Ok(reference)
        })
        .collect()
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
        assert_eq!(jsonpath_style, FieldPath::default_extensions());
    }

    #[test]
    fn malformed_paths_are_refused() {
        for bad in ["", ".", "spec..extensions", "spec."] {
            assert!(bad.parse::<FieldPath>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn references_parse_with_an_optional_namespace() {
        let value = json!([
            {"apiVersion": "myorg.org/v1alpha1", "kind": "DatabaseTableMariaDbExtension", "name": "users"},
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "settings", "namespace": "shared"},
        ]);
        let references = parse_references("spec.extensions", Some(&value)).expect("valid");
        assert_eq!(references.len(), 2);
        assert_eq!(references[0].group_version(), ("myorg.org", "v1alpha1"));
        assert_eq!(references[1].group_version(), ("", "v1"));
        assert_eq!(references[1].namespace.as_deref(), Some("shared"));
        assert_eq!(references[1].to_string(), "v1 ConfigMap shared/settings");
    }

    #[test]
    fn no_references_is_no_extensions() {
        for value in [None, Some(&Value::Null)] {
            let references = parse_references("spec.extensions", value).expect("ok");
            assert!(references.is_empty());
        }
    }

    #[test]
    fn bad_references_say_which_and_why() {
        let cases = [
            (
                json!("users"),
                "must be a list of object references, not a string",
            ),
            (
                json!([{"apiVersion": "v1", "kind": "ConfigMap"}]),
                "spec.extensions[0]",
            ),
            (
                json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": ""}]),
                "name must not be empty",
            ),
            (
                json!([{"apiVersion": "a/b/c", "kind": "K", "name": "n"}]),
                "must be GROUP/VERSION or VERSION",
            ),
            (
                json!([42]),
                "spec.extensions[0] is not a valid object reference",
            ),
        ];
        for (value, expected) in cases {
            let error = parse_references("spec.extensions", Some(&value))
                .expect_err("invalid")
                .to_string();
            assert!(error.contains(expected), "{value}: {error}");
        }
    }
}
