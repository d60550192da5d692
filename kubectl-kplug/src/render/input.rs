//! What `kubectl kplug render` sends: every document of the `-f` files, in
//! order, the first the object and the rest its extensions, each checked to
//! be a Kubernetes object as kplug checks one before calling a plugin; and
//! the observed children of the `--observed` files, each under the key the
//! operator annotated it with.

use kplug_api::children::KEY_ANNOTATION;
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
        "{file}, document {document}: no {KEY_ANNOTATION} annotation: an observed child is a \
         child the operator applied, which it annotates with the child's key"
    )]
    NoKey { file: String, document: usize },
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
        for (document, object) in file_documents(file, text)? {
            check(&object).map_err(|reason| InputError::NotAnObject {
                file: file.clone(),
                document,
                reason,
            })?;
            documents.push(object);
        }
    }
    let mut documents = documents.into_iter().map(|d| d.to_string().into_bytes());
    let object = documents.next().unwrap_or_default();
    Ok(Objects {
        object,
        extensions: documents.collect(),
    })
}

/// The observed children in `files`, by key, in order: each object, or
/// each item of a `List` (what `kubectl get -o yaml` prints for several),
/// with the key annotation the operator set on it.
pub fn observed(files: &[(String, String)]) -> Result<Vec<(String, Vec<u8>)>, InputError> {
    let mut children = Vec::new();
    for (file, text) in files {
        for (document, object) in file_documents(file, text)? {
            let items = match object.get("items").and_then(Value::as_array) {
                Some(items) if object["kind"] == "List" => items.clone(),
                _ => vec![object],
            };
            for item in items {
                check(&item).map_err(|reason| InputError::NotAnObject {
                    file: file.clone(),
                    document,
                    reason,
                })?;
                let key = item["metadata"]["annotations"][KEY_ANNOTATION].as_str();
                let key = key.ok_or_else(|| InputError::NoKey {
                    file: file.clone(),
                    document,
                })?;
                children.push((key.to_owned(), item.to_string().into_bytes()));
            }
        }
    }
    Ok(children)
}

/// The documents of one file with their numbers from 1; empty documents
/// are skipped, as kubectl skips them (a leading or trailing `---`), and a
/// file with none is refused.
fn file_documents(file: &str, text: &str) -> Result<Vec<(usize, Value)>, InputError> {
    let parsed: Vec<Value> =
        serde_saphyr::from_multiple(text).map_err(|error| InputError::Unreadable {
            file: file.to_owned(),
            reason: error.to_string(),
        })?;
    let mut documents = Vec::new();
    for (index, document) in parsed.into_iter().enumerate() {
        if !document.is_null() {
            documents.push((index + 1, document));
        }
    }
    if documents.is_empty() {
        return Err(InputError::Empty {
            file: file.to_owned(),
        });
    }
    Ok(documents)
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
    fn observed_children_are_read_by_their_key_annotation_from_objects_and_lists() {
        let deployment = format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n  annotations: \
             {{{KEY_ANNOTATION}: web}}\nstatus: {{availableReplicas: 1}}\n"
        );
        let list = format!(
            "apiVersion: v1\nkind: List\nmetadata: {{resourceVersion: ''}}\nitems:\n- apiVersion: v1\n  \
             kind: Service\n  metadata: {{name: web, annotations: {{{KEY_ANNOTATION}: svc}}}}\n"
        );
        let read = observed(&[file("d.yaml", &deployment), file("l.yaml", &list)]);
        let read = read.expect("observed children");
        let keys: Vec<&str> = read.iter().map(|(key, _)| key.as_str()).collect();
        assert_eq!(keys, ["web", "svc"]);
        let live: Value = serde_json::from_slice(&read[0].1).expect("JSON");
        assert_eq!(live["status"]["availableReplicas"], 1);
        let unkeyed = observed(&[file(
            "u.yaml",
            "apiVersion: v1\nkind: Service\nmetadata: {name: web}\n",
        )]);
        assert_eq!(
            unkeyed,
            Err(InputError::NoKey {
                file: "u.yaml".to_owned(),
                document: 1
            })
        );
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
