//! What `kubectl kplug render` sends: every document of the `-f` files, in
//! order, the first the object and the rest its extensions, each checked to
//! be a Kubernetes object as kplug checks one before calling a plugin.

use kplug_operator::extensions::type_name;
use serde_json::Value;

/// The object and its extensions, as the JSON a plugin receives.
#[derive(Debug, PartialEq)]
pub struct Objects {
    pub object: Vec<u8>,
    pub extensions: Vec<Vec<u8>>,
}

/// What is wrong with one document.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    #[error("{file}: {reason}")]
    Unreadable { file: String, reason: String },
    #[error("{file}: no object in it (every document is empty)")]
    Empty { file: String },
    #[error(
        "{file}, document {document}: not a Kubernetes object: {reason}\n  every document must be an object with apiVersion, kind and metadata.name"
    )]
    NotAnObject {
        file: String,
        document: usize,
        reason: String,
    },
}

/// The objects in `files` (each a name and its text), in order.
pub fn objects(files: &[(String, String)]) -> Result<Objects, InputError> {
    let mut documents = Vec::new();
    for (file, text) in files {
        let parsed: Vec<Value> =
            serde_saphyr::from_multiple(text).map_err(|error| InputError::Unreadable {
                file: file.clone(),
                reason: error.to_string(),
            })?;
        // kubectl skips empty documents (a leading or trailing `---`).
        let mut found = false;
        for (index, document) in parsed.into_iter().enumerate() {
            if document.is_null() {
                continue;
            }
            check(&document).map_err(|reason| InputError::NotAnObject {
                file: file.clone(),
                document: index + 1,
                reason,
            })?;
            documents.push(document.to_string().into_bytes());
            found = true;
        }
        if !found {
            return Err(InputError::Empty { file: file.clone() });
        }
    }
    let mut documents = documents.into_iter();
    let object = documents.next().unwrap_or_default();
    Ok(Objects {
        object,
        extensions: documents.collect(),
    })
}

/// An object whose `apiVersion`, `kind` and `metadata.name` are non-empty
/// strings: what kplug requires of an object before it calls a plugin.
fn check(document: &Value) -> Result<(), String> {
    let Some(map) = document.as_object() else {
        return Err(format!("it is {}", type_name(document)));
    };
    let string = |value: Option<&Value>, field: &str| match value {
        Some(Value::String(text)) if !text.is_empty() => Ok(()),
        Some(Value::String(_)) | None => Err(format!("{field}: Required value")),
        Some(other) => Err(format!(
            "{field}: Invalid value: {}: must be a string",
            type_name(other)
        )),
    };
    string(map.get("apiVersion"), "apiVersion")?;
    string(map.get("kind"), "kind")?;
    match map.get("metadata") {
        Some(Value::Object(metadata)) => string(metadata.get("name"), "metadata.name"),
        None => Err("metadata.name: Required value".to_owned()),
        Some(other) => Err(format!(
            "metadata: Invalid value: {}: must be an object",
            type_name(other)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, text: &str) -> (String, String) {
        (name.to_owned(), text.to_owned())
    }

    #[test]
    fn the_first_document_is_the_object_and_the_rest_its_extensions() {
        let objects = objects(&[
            file(
                "table.yaml",
                "---\napiVersion: myorg.org/v1alpha1\nkind: DatabaseTable\nmetadata: {name: users}\n---\n",
            ),
            file(
                "extensions.json",
                r#"{"apiVersion":"v1","kind":"A","metadata":{"name":"a"}}
---
apiVersion: v1
kind: B
metadata: {name: b, namespace: shop}"#,
            ),
        ])
        .expect("objects");
        let json = |bytes: &[u8]| serde_json::from_slice::<Value>(bytes).expect("JSON");
        assert_eq!(json(&objects.object)["kind"], "DatabaseTable");
        assert_eq!(objects.extensions.len(), 2);
        assert_eq!(json(&objects.extensions[0])["kind"], "A");
        assert_eq!(
            json(&objects.extensions[1])["metadata"]["namespace"],
            "shop"
        );
    }

    #[test]
    fn what_is_not_an_object_is_refused_naming_the_file_document_and_field() {
        let cases = [
            (
                "- a\n- b\n",
                "f.yaml, document 1: not a Kubernetes object: it is a list",
            ),
            (
                "kind: X\nmetadata: {name: a}\n",
                "f.yaml, document 1: not a Kubernetes object: apiVersion: Required value",
            ),
            (
                "apiVersion: v1\nkind: 3\nmetadata: {name: a}\n",
                "f.yaml, document 1: not a Kubernetes object: kind: Invalid value: a number: must be a string",
            ),
            (
                "apiVersion: v1\nkind: X\n",
                "f.yaml, document 1: not a Kubernetes object: metadata.name: Required value",
            ),
            (
                "apiVersion: v1\nkind: X\nmetadata: [a]\n",
                "f.yaml, document 1: not a Kubernetes object: metadata: Invalid value: a list: must be an object",
            ),
            (
                "apiVersion: v1\nkind: X\nmetadata: {name: a}\n---\nplain words\n",
                "f.yaml, document 2: not a Kubernetes object: it is a string",
            ),
        ];
        for (text, message) in cases {
            let error = objects(&[file("f.yaml", text)]).expect_err(text);
            let first_line = error.to_string();
            assert_eq!(first_line.lines().next(), Some(message), "{text}");
        }
    }

    #[test]
    fn unreadable_and_empty_files_are_refused() {
        let error = objects(&[file("f.yaml", "a: [unclosed\n")]).expect_err("unclosed");
        assert!(matches!(error, InputError::Unreadable { .. }), "{error}");
        assert!(error.to_string().starts_with("f.yaml: "), "{error}");
        let error = objects(&[file("f.yaml", "---\n---\n")]).expect_err("empty");
        assert_eq!(
            error,
            InputError::Empty {
                file: "f.yaml".to_owned()
            }
        );
    }
}
