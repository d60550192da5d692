//! The Reconcile request body, read in one pass: the fields kplug needs are
//! decoded, unknown field names are collected for `fieldValidation`, and
//! the object and its extensions are taken as the exact bytes the client
//! sent, with their `apiVersion`, `kind` and `metadata.name` read on the way
//! through. Nothing is copied: the object goes on to the plugin and back in
//! the answer as a slice of the body.
//!
//! It accepts and rejects what decoding into `kplug_api::v1alpha1::Reconcile`
//! with serde_json did, with the same messages, except that it is stricter
//! in three corners no client uses: a Reconcile, its spec or an object's
//! metadata written as a JSON array (serde reads structs from arrays by
//! position) and invalid UTF-8 inside a field kplug ignores are rejected.
//! Small typed fields (strings, `metadata`, `api`) are decoded by serde_json
//! from their slice, so their rules and messages are serde's own.

use std::borrow::Cow;
use std::ops::Range;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::DeserializeOwned;

use super::scan::{Key, Reason, Scanner, SyntaxError};
use crate::v1alpha1::{ApiSelector, ReconcileStatus};

/// A decoded Reconcile request, borrowing the object and extensions from
/// the body.
#[derive(Debug, Default)]
pub struct Request<'a> {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: Spec<'a>,
    /// Fields this version does not know, as `colour` or `spec.colour`:
    /// top-level ones first, each group sorted and without repeats.
    pub unknown: Vec<String>,
}

/// `spec` of a Reconcile; see `kplug_api::v1alpha1::ReconcileSpec`.
#[derive(Debug, Default)]
pub struct Spec<'a> {
    pub operation: Option<String>,
    pub dry_run: bool,
    pub timeout_seconds: Option<i64>,
    pub object: Option<Object<'a>>,
    pub extensions: Vec<Object<'a>>,
    pub api: Option<ApiSelector>,
    pub preferred_implementation: Option<String>,
    pub required_implementation: Option<String>,
    pub plugin: Option<String>,
}

/// A JSON value meant to be a Kubernetes object, as it was sent.
#[derive(Debug, Clone, Copy)]
pub struct Object<'a> {
    /// The value's bytes, valid JSON and UTF-8.
    pub raw: &'a [u8],
    pub head: Head,
}

/// What kplug checks of an object it otherwise passes on untouched.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Head {
    /// A JSON object whose `apiVersion`, `kind` and `metadata.name` are each
    /// a string or null, at most once.
    pub readable: bool,
    /// Each of these is a non-empty string.
    pub api_version: bool,
    pub kind: bool,
    pub name: bool,
}

/// Decodes a Reconcile request body.
pub fn request(body: &[u8]) -> Result<Request<'_>, SyntaxError> {
    let mut s = Scanner::new(body);
    open_object(&mut s, "struct Reconcile")?;
    let mut request = Request::default();
    let mut seen = Seen::default();
    let mut spec = None;
    let mut spec_unknown = Vec::new();
    let mut first = true;
    while let Some(key) = s.next_key(&mut first)? {
        match &*key_name(&s, key)? {
            b"apiVersion" => {
                seen.once(&s, key, "apiVersion")?;
                request.api_version = typed(&mut s)?;
            }
            b"kind" => {
                seen.once(&s, key, "kind")?;
                request.kind = typed(&mut s)?;
            }
            b"metadata" => {
                seen.once(&s, key, "metadata")?;
                request.metadata = typed(&mut s)?;
            }
            b"spec" => {
                seen.once(&s, key, "spec")?;
                spec = Some(read_spec(&mut s, &mut spec_unknown)?);
            }
            b"status" => {
                // Checked as before, though kplug fills in its own.
                seen.once(&s, key, "status")?;
                typed::<Option<ReconcileStatus>>(&mut s)?;
            }
            other => {
                request
                    .unknown
                    .push(String::from_utf8_lossy(other).into_owned());
                s.skip_value()?;
            }
        }
    }
    // serde_json puts a missing field at the closing brace.
    request.spec = spec.ok_or_else(|| s.error_at(Reason::MissingField("spec"), s.pos() - 1))?;
    s.end()?;
    sort_unique(&mut request.unknown);
    sort_unique(&mut spec_unknown);
    request
        .unknown
        .extend(spec_unknown.into_iter().map(|name| format!("spec.{name}")));
    Ok(request)
}

fn read_spec<'a>(s: &mut Scanner<'a>, unknown: &mut Vec<String>) -> Result<Spec<'a>, SyntaxError> {
    open_object(s, "struct ReconcileSpec")?;
    let mut spec = Spec::default();
    let mut seen = Seen::default();
    let mut first = true;
    while let Some(key) = s.next_key(&mut first)? {
        match &*key_name(s, key)? {
            b"operation" => {
                seen.once(s, key, "operation")?;
                spec.operation = typed(s)?;
            }
            b"dryRun" => {
                seen.once(s, key, "dryRun")?;
                spec.dry_run = typed(s)?;
            }
            b"timeoutSeconds" => {
                seen.once(s, key, "timeoutSeconds")?;
                spec.timeout_seconds = typed(s)?;
            }
            b"object" => {
                seen.once(s, key, "object")?;
                spec.object = if s.peek() == Some(b'n') {
                    s.skip_value()?;
                    None
                } else {
                    Some(object(s)?)
                };
            }
            b"extensions" => {
                seen.once(s, key, "extensions")?;
                spec.extensions = extensions(s)?;
            }
            b"api" => {
                seen.once(s, key, "api")?;
                spec.api = typed(s)?;
            }
            b"preferredImplementation" => {
                seen.once(s, key, "preferredImplementation")?;
                spec.preferred_implementation = typed(s)?;
            }
            b"requiredImplementation" => {
                seen.once(s, key, "requiredImplementation")?;
                spec.required_implementation = typed(s)?;
            }
            b"plugin" => {
                seen.once(s, key, "plugin")?;
                spec.plugin = typed(s)?;
            }
            other => {
                unknown.push(String::from_utf8_lossy(other).into_owned());
                s.skip_value()?;
            }
        }
    }
    Ok(spec)
}

fn extensions<'a>(s: &mut Scanner<'a>) -> Result<Vec<Object<'a>>, SyntaxError> {
    match s.peek() {
        Some(b'[') => s.bump(),
        Some(b) => return Err(wrong_type(s, b, "a sequence")),
        None => return Err(s.error(Reason::EofValue)),
    }
    let mut list = Vec::new();
    let mut first = true;
    while s.next_element(&mut first)? {
        list.push(object(s)?);
    }
    Ok(list)
}

/// An object and its head, in the same pass.
fn object<'a>(s: &mut Scanner<'a>) -> Result<Object<'a>, SyntaxError> {
    let mut head = Head::default();
    let start = match s.peek() {
        Some(b'{') => s.pos(),
        Some(_) => {
            let range = s.skip_value()?;
            return Ok(Object {
                raw: &s.bytes()[range],
                head,
            });
        }
        None => return Err(s.error(Reason::EofValue)),
    };
    s.bump();
    head.readable = true;
    let (mut api_version, mut kind, mut metadata) = (false, false, false);
    let mut first = true;
    while let Some(key) = s.next_key(&mut first)? {
        match head_key(s, key).as_deref() {
            Some(b"apiVersion") => {
                head_string(
                    s,
                    &mut api_version,
                    &mut head.api_version,
                    &mut head.readable,
                )?;
            }
            Some(b"kind") => head_string(s, &mut kind, &mut head.kind, &mut head.readable)?,
            Some(b"metadata") => {
                head.readable &= !metadata;
                metadata = true;
                read_metadata(s, &mut head)?;
            }
            Some(_) => {
                s.skip_value()?;
            }
            None => {
                head.readable = false;
                s.skip_value()?;
            }
        }
    }
    Ok(Object {
        raw: &s.bytes()[start..s.pos()],
        head,
    })
}

fn read_metadata(s: &mut Scanner<'_>, head: &mut Head) -> Result<(), SyntaxError> {
    if s.peek() != Some(b'{') {
        head.readable = false;
        s.skip_value()?;
        return Ok(());
    }
    s.bump();
    let mut name = false;
    let mut first = true;
    while let Some(key) = s.next_key(&mut first)? {
        match head_key(s, key).as_deref() {
            Some(b"name") => head_string(s, &mut name, &mut head.name, &mut head.readable)?,
            Some(_) => {
                s.skip_value()?;
            }
            None => {
                head.readable = false;
                s.skip_value()?;
            }
        }
    }
    Ok(())
}

/// One of the head's strings: `present` when a non-empty string; a second
/// occurrence, or a value that is neither a string nor null, makes the
/// head unreadable.
fn head_string(
    s: &mut Scanner<'_>,
    seen: &mut bool,
    present: &mut bool,
    readable: &mut bool,
) -> Result<(), SyntaxError> {
    *readable &= !*seen;
    *seen = true;
    let kind = s.peek();
    let range = s.skip_value()?;
    let text = &s.bytes()[range];
    match kind {
        Some(b'"') => {
            // An escape may still not decode (a lone surrogate).
            if text.contains(&b'\\') && serde_json::from_slice::<String>(text).is_err() {
                *readable = false;
            }
            // Any escape decodes to something, so only `""` is empty.
            *present = text.len() > 2;
        }
        Some(b'n') => *present = false,
        _ => *readable = false,
    }
    Ok(())
}

/// Opens an object where one must be.
fn open_object(s: &mut Scanner<'_>, expected: &'static str) -> Result<(), SyntaxError> {
    match s.peek() {
        Some(b'{') => {
            s.bump();
            Ok(())
        }
        Some(b) => Err(wrong_type(s, b, expected)),
        None => Err(s.error(Reason::EofValue)),
    }
}

/// A value of the wrong type starting with `first`.
fn wrong_type(s: &Scanner<'_>, first: u8, expected: &'static str) -> SyntaxError {
    let found = match first {
        b'"' => "string",
        b'[' => "sequence",
        b'{' => "map",
        b't' | b'f' => "boolean",
        b'n' => "null",
        b'-' | b'0'..=b'9' => "number",
        _ => return s.error(Reason::ExpectedValue),
    };
    s.error(Reason::InvalidType { found, expected })
}

/// Known fields already read, to refuse a second one as serde does.
#[derive(Default)]
struct Seen(Vec<&'static str>);

impl Seen {
    fn once(
        &mut self,
        s: &Scanner<'_>,
        key: Key<'_>,
        field: &'static str,
    ) -> Result<(), SyntaxError> {
        if self.0.contains(&field) {
            // At the key's closing quote, as serde_json reports it.
            let closing = key.start + key.raw.len() + 1;
            return Err(s.error_at(Reason::DuplicateField(field), closing));
        }
        self.0.push(field);
        Ok(())
    }
}

/// The key's name: borrowed, or decoded as serde_json does when it holds
/// escapes (a name that does not decode fails the request, as before).
fn key_name<'a>(s: &Scanner<'a>, key: Key<'a>) -> Result<Cow<'a, [u8]>, SyntaxError> {
    if !key.escaped {
        return Ok(Cow::Borrowed(key.raw));
    }
    let range = key.start..key.start + key.raw.len() + 2;
    serde_json::from_slice::<String>(&s.bytes()[range.clone()])
        .map(|name| Cow::Owned(name.into_bytes()))
        .map_err(|e| located(s, &range, &e))
}

/// A key inside an object: `None` when it does not decode, which only
/// makes the head unreadable (the object itself is passed on as it is).
fn head_key<'a>(s: &Scanner<'a>, key: Key<'a>) -> Option<Cow<'a, [u8]>> {
    key_name(s, key).ok()
}

/// The next value, decoded by serde_json from its slice of the body.
fn typed<T: DeserializeOwned>(s: &mut Scanner<'_>) -> Result<T, SyntaxError> {
    let range = s.skip_value()?;
    serde_json::from_slice(&s.bytes()[range.clone()]).map_err(|e| located(s, &range, &e))
}

/// serde_json's error on the value at `range`, placed in the whole body.
fn located(s: &Scanner<'_>, range: &Range<usize>, error: &serde_json::Error) -> SyntaxError {
    let message = error.to_string();
    let position = format!(" at line {} column {}", error.line(), error.column());
    let message = message
        .strip_suffix(&position)
        .unwrap_or(&message)
        .to_owned();
    let value = &s.bytes()[range.clone()];
    let line_start = match error.line() {
        0 | 1 => 0,
        line => value
            .iter()
            .enumerate()
            .filter(|&(_, &b)| b == b'\n')
            .nth(line - 2)
            .map_or(0, |(i, _)| i + 1),
    };
    let offset = range.start + line_start + error.column().saturating_sub(1);
    s.error_at(Reason::Field(message), offset)
}

fn sort_unique(names: &mut Vec<String>) {
    names.sort_unstable();
    names.dedup();
}

#[cfg(test)]
#[path = "decode_tests.rs"]
mod tests;
