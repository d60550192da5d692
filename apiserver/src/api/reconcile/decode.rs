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
use serde::Deserializer;
use serde::de::{DeserializeOwned, DeserializeSeed, Visitor};

use super::scan::{Key, Reason, Scanner, SyntaxError};
use crate::v1alpha1::{
    ApiSelector, ChildScope, ObservedChild, Reconcile, ReconcileSpec, ReconcileStatus,
    StoredObjectRef,
};

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
    pub object_ref: Option<StoredObjectRef>,
    pub extensions: Vec<Object<'a>>,
    pub api: Option<ApiSelector>,
    pub preferred_implementation: Option<String>,
    pub required_implementation: Option<String>,
    pub version_constraint: Option<String>,
    pub plugin: Option<String>,
    /// Decoded by serde, copies: only operators that manage children send
    /// them, and each is read again for its head when it is checked.
    pub observed_children: Vec<ObservedChild>,
    pub child_scope: Option<ChildScope>,
}

/// A JSON value meant to be a Kubernetes object, as it was sent.
#[derive(Debug, Clone, Copy)]
pub struct Object<'a> {
    /// The value's bytes, valid JSON and UTF-8.
    pub raw: &'a [u8],
    pub head: Head<'a>,
}

/// What kplug checks of an object it otherwise passes on untouched, and
/// whose rights the caller must hold on it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Head<'a> {
    /// A JSON object whose `apiVersion`, `kind`, `metadata.name` and
    /// `metadata.namespace` are each a string or null, at most once.
    pub readable: bool,
    /// Each of these when a non-empty string.
    pub api_version: Option<Text<'a>>,
    pub kind: Option<Text<'a>>,
    pub name: Option<Text<'a>>,
    pub namespace: Option<Text<'a>>,
}

impl<'a> Head<'a> {
    /// The values of the head's strings, each empty when absent.
    pub fn names(&self) -> Names<'a> {
        let value = |text: Option<Text<'a>>| text.map(Text::value).unwrap_or_default();
        Names {
            api_version: value(self.api_version),
            kind: value(self.kind),
            namespace: value(self.namespace),
            name: value(self.name),
        }
    }
}

/// An object's apiVersion, kind, namespace and name.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Names<'a> {
    pub api_version: Cow<'a, str>,
    pub kind: Cow<'a, str>,
    pub namespace: Cow<'a, str>,
    pub name: Cow<'a, str>,
}

/// A JSON string as it was sent, quotes included, that decodes: read only
/// when kplug needs its value.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Text<'a>(&'a [u8]);

impl<'a> Text<'a> {
    /// The string's value, borrowed from the body unless it has escapes.
    pub fn value(self) -> Cow<'a, str> {
        let inner = &self.0[1..self.0.len() - 1];
        match std::str::from_utf8(inner) {
            Ok(text) if !inner.contains(&b'\\') => Cow::Borrowed(text),
            // The decoder checked that it decodes.
            _ => Cow::Owned(serde_json::from_slice(self.0).unwrap_or_default()),
        }
    }
}

impl std::fmt::Debug for Text<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.value().fmt(f)
    }
}

impl Request<'_> {
    /// This request with other objects: those kplug read for a reconcile
    /// by reference.
    pub fn with_objects<'b>(&self, object: Object<'b>, extensions: Vec<Object<'b>>) -> Request<'b> {
        let spec = &self.spec;
        Request {
            api_version: self.api_version.clone(),
            kind: self.kind.clone(),
            metadata: self.metadata.clone(),
            spec: Spec {
                operation: spec.operation.clone(),
                dry_run: spec.dry_run,
                timeout_seconds: spec.timeout_seconds,
                object: Some(object),
                object_ref: spec.object_ref.clone(),
                extensions,
                api: spec.api.clone(),
                preferred_implementation: spec.preferred_implementation.clone(),
                required_implementation: spec.required_implementation.clone(),
                version_constraint: spec.version_constraint.clone(),
                plugin: spec.plugin.clone(),
                observed_children: spec.observed_children.clone(),
                child_scope: spec.child_scope,
            },
            unknown: self.unknown.clone(),
        }
    }
}

/// Reads one whole object, as kube-apiserver serves it, and its head.
pub fn stored_object(bytes: &[u8]) -> Result<Object<'_>, SyntaxError> {
    let mut s = Scanner::new(bytes);
    let read = object(&mut s)?;
    s.end()?;
    Ok(read)
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
    while let Some(key) = next_field(&mut s, &mut first)? {
        // In serde_json's order: the key decodes, is not a repeat, then `:`.
        let name = key_name(&s, key)?;
        seen.once(&s, key, &name, Reconcile::FIELDS)?;
        s.colon()?;
        match &*name {
            b"apiVersion" => {
                request.api_version = typed(&mut s, 1)?;
            }
            b"kind" => {
                request.kind = typed(&mut s, 1)?;
            }
            b"metadata" => {
                request.metadata = typed(&mut s, 1)?;
            }
            b"spec" => {
                spec = Some(read_spec(&mut s, &mut spec_unknown)?);
            }
            b"status" => {
                // Checked as before, though kplug fills in its own.
                typed::<Option<ReconcileStatus>>(&mut s, 1)?;
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
    while let Some(key) = next_field(s, &mut first)? {
        let name = key_name(s, key)?;
        seen.once(s, key, &name, ReconcileSpec::FIELDS)?;
        s.colon()?;
        match &*name {
            b"operation" => {
                spec.operation = typed(s, 2)?;
            }
            b"dryRun" => {
                spec.dry_run = typed(s, 2)?;
            }
            b"timeoutSeconds" => {
                spec.timeout_seconds = typed(s, 2)?;
            }
            b"object" => {
                spec.object = if s.peek() == Some(b'n') {
                    s.skip_value()?;
                    None
                } else {
                    Some(object(s)?)
                };
            }
            b"objectRef" => {
                spec.object_ref = typed(s, 2)?;
            }
            b"extensions" => {
                spec.extensions = extensions(s)?;
            }
            b"api" => {
                spec.api = typed(s, 2)?;
            }
            b"preferredImplementation" => {
                spec.preferred_implementation = typed(s, 2)?;
            }
            b"requiredImplementation" => {
                spec.required_implementation = typed(s, 2)?;
            }
            b"versionConstraint" => {
                spec.version_constraint = typed(s, 2)?;
            }
            b"plugin" => {
                spec.plugin = typed(s, 2)?;
            }
            b"observedChildren" => {
                spec.observed_children = typed(s, 2)?;
            }
            b"childScope" => {
                spec.child_scope = typed(s, 2)?;
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

fn read_metadata<'a>(s: &mut Scanner<'a>, head: &mut Head<'a>) -> Result<(), SyntaxError> {
    if s.peek() != Some(b'{') {
        head.readable = false;
        s.skip_value()?;
        return Ok(());
    }
    s.bump();
    let (mut name, mut namespace) = (false, false);
    let mut first = true;
    while let Some(key) = s.next_key(&mut first)? {
        match head_key(s, key).as_deref() {
            Some(b"name") => head_string(s, &mut name, &mut head.name, &mut head.readable)?,
            Some(b"namespace") => {
                head_string(s, &mut namespace, &mut head.namespace, &mut head.readable)?
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
    Ok(())
}

/// One of the head's strings: `present` when a non-empty string; a second
/// occurrence, or a value that is neither a string nor null, makes the
/// head unreadable.
fn head_string<'a>(
    s: &mut Scanner<'a>,
    seen: &mut bool,
    present: &mut Option<Text<'a>>,
    readable: &mut bool,
) -> Result<(), SyntaxError> {
    *readable &= !*seen;
    *seen = true;
    let kind = s.peek();
    let range = s.skip_value()?;
    let bytes = s.bytes();
    let text = &bytes[range];
    match kind {
        Some(b'"') => {
            // An escape may still not decode (a lone surrogate).
            if text.contains(&b'\\') && serde_json::from_slice::<String>(text).is_err() {
                *readable = false;
            }
            // Any escape decodes to something, so only `""` is empty.
            *present = (text.len() > 2).then_some(Text(text));
        }
        Some(b'n') => *present = None,
        _ => *readable = false,
    }
    Ok(())
}

/// The next field name of a struct, as [`Scanner::next_field`]. serde_json
/// decodes a field name as it reads it, which finds some flaws earlier than
/// checking it does (a `\\u` escape for half a surrogate pair): a flawed
/// name is refused as serde_json refuses it.
fn next_field<'a>(s: &mut Scanner<'a>, first: &mut bool) -> Result<Option<Key<'a>>, SyntaxError> {
    let before = s.pos();
    s.next_field(first).map_err(|flaw| {
        let in_a_string = matches!(
            flaw.reason,
            Reason::EofString
                | Reason::InvalidEscape
                | Reason::ControlCharacter
                | Reason::InvalidUnicode
        );
        if !in_a_string {
            return flaw;
        }
        let ahead = &s.bytes()[before..];
        let Some(quote) = ahead.iter().position(|&b| b == b'"') else {
            return flaw;
        };
        let separator = ahead[..quote]
            .iter()
            .all(|b| matches!(b, b' ' | b'\n' | b'\t' | b'\r' | b','));
        if !separator {
            return flaw;
        }
        // The name alone: what follows it is not read.
        let rest = before + quote..s.bytes().len();
        let mut name = serde_json::Deserializer::from_slice(&s.bytes()[rest.clone()]);
        match <String as serde::Deserialize>::deserialize(&mut name) {
            Err(e) => located(s, &rest, &e, 0),
            Ok(_) => flaw,
        }
    })
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

/// A value of the wrong type starting with `first` (at the scanner's
/// position). serde_json describes a scalar by its value (integer `2`,
/// string "x") once it has read it, so serde_json reads and describes it.
fn wrong_type(s: &mut Scanner<'_>, first: u8, expected: &'static str) -> SyntaxError {
    let found = match first {
        b'[' => "sequence",
        // serde_json refuses a map before reading its `{`.
        b'{' => {
            let found = Reason::InvalidType {
                found: "map",
                expected,
            };
            return s.error_after(found, s.pos());
        }
        b'"' | b't' | b'f' | b'n' | b'-' | b'0'..=b'9' => {
            // serde_json decodes the scalar (its flaws reported as decoding
            // reports them), then refuses it.
            let rest = s.pos()..s.bytes().len();
            let mut scalar = serde_json::Deserializer::from_slice(&s.bytes()[rest.clone()]);
            return match Expecting(expected).deserialize(&mut scalar) {
                Err(e) => located(s, &rest, &e, 0),
                // Expecting takes nothing; a scalar never gets this far.
                Ok(()) => s.error(Reason::ExpectedValue),
            };
        }
        _ => return s.error(Reason::ExpectedValue),
    };
    s.error(Reason::InvalidType { found, expected })
}

/// Refuses any value, in serde's words, as something that expected `.0`.
struct Expecting(&'static str);

impl<'de> DeserializeSeed<'de> for Expecting {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl Visitor<'_> for Expecting {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

/// Known fields already read, to refuse a second one as serde does.
#[derive(Default)]
struct Seen(Vec<&'static str>);

impl Seen {
    /// Records `name` if it is one of `fields`; a second time, refuses it.
    fn once(
        &mut self,
        s: &Scanner<'_>,
        key: Key<'_>,
        name: &[u8],
        fields: &'static [&'static str],
    ) -> Result<(), SyntaxError> {
        let Some(&field) = fields.iter().find(|field| field.as_bytes() == name) else {
            return Ok(());
        };
        if self.0.contains(&field) {
            // serde_json has read the key, then looked for the end of the
            // object: the whitespace after the key, and a `}` there.
            let after_key = key.start + key.raw.len() + 2;
            let whitespace = s.bytes()[after_key..]
                .iter()
                .take_while(|b| matches!(b, b' ' | b'\n' | b'\t' | b'\r'))
                .count();
            let brace = usize::from(s.bytes().get(after_key + whitespace) == Some(&b'}'));
            return Err(s.error_after(
                Reason::DuplicateField(field),
                after_key + whitespace + brace,
            ));
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
        .map_err(|e| located(s, &range, &e, 0))
}

/// A key inside an object: `None` when it does not decode, which only
/// makes the head unreadable (the object itself is passed on as it is).
fn head_key<'a>(s: &Scanner<'a>, key: Key<'a>) -> Option<Cow<'a, [u8]>> {
    key_name(s, key).ok()
}

/// serde_json refuses the 128th level of nesting, counted from the root.
const SERDE_DEPTH_LIMIT: usize = 128;

/// The next value, `depth` containers deep in the body, decoded by
/// serde_json from its slice of the body.
fn typed<T: DeserializeOwned>(s: &mut Scanner<'_>, depth: usize) -> Result<T, SyntaxError> {
    s.peek();
    let start = s.pos();
    match s.skip_value() {
        Ok(range) => decode_nested(&s.bytes()[range.clone()], depth, true)
            .map_err(|(e, shift)| located(s, &range, &e, shift)),
        // Malformed: serde_json, decoding it, says what and where, as it
        // did reading the whole body (it reports some flaws elsewhere when
        // decoding than when skipping).
        Err(malformed) => {
            let rest = start..s.bytes().len();
            match decode_nested::<T>(&s.bytes()[rest.clone()], depth, false) {
                Err((e, shift)) => Err(located(s, &rest, &e, shift)),
                Ok(_) => Err(malformed),
            }
        }
    }
}

/// Decodes `value` as serde_json did inside the body, `depth` containers
/// deep: one nested that deep is decoded inside as many arrays, so that it
/// meets the depth limit where it did (the error's columns on the first
/// line are then `shift` too far). `whole`: nothing may follow the value.
fn decode_nested<T: DeserializeOwned>(
    value: &[u8],
    depth: usize,
    whole: bool,
) -> Result<T, (serde_json::Error, usize)> {
    let containers = value.iter().filter(|&&b| b == b'[' || b == b'{').count();
    if containers + depth < SERDE_DEPTH_LIMIT {
        let mut reader = serde_json::Deserializer::from_slice(value);
        let decoded = T::deserialize(&mut reader).map_err(|e| (e, 0))?;
        if whole {
            reader.end().map_err(|e| (e, 0))?;
        }
        return Ok(decoded);
    }
    let mut wrapped = Vec::with_capacity(value.len() + 2 * depth);
    wrapped.extend(std::iter::repeat_n(b'[', depth));
    wrapped.extend_from_slice(value);
    // The rest of a malformed body is not closed: its flaw, an EOF included,
    // must stay where it is.
    if whole {
        wrapped.extend(std::iter::repeat_n(b']', depth));
    }
    let mut reader = serde_json::Deserializer::from_slice(&wrapped);
    let mut decoded = None;
    let outcome = Nested::new(depth, &mut decoded).deserialize(&mut reader);
    match (outcome, decoded) {
        (Ok(()), Some(value)) => Ok(value),
        // Not `whole`: the rest of the body follows the value inside the
        // wrapping arrays, which serde_json calls trailing characters of
        // the innermost one; only whether the value decoded counts.
        (Err(_), Some(value)) if !whole => Ok(value),
        (Err(e), _) => Err((e, depth)),
        (Ok(()), None) => Err((serde::de::Error::custom("expected value"), depth)),
    }
}

/// A `T` inside `depth` single-element arrays, put in `decoded`.
struct Nested<'d, T> {
    depth: usize,
    decoded: &'d mut Option<T>,
}

impl<'d, T> Nested<'d, T> {
    fn new(depth: usize, decoded: &'d mut Option<T>) -> Self {
        Self { depth, decoded }
    }
}

impl<'de, T: serde::Deserialize<'de>> DeserializeSeed<'de> for Nested<'_, T> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        if self.depth == 0 {
            *self.decoded = Some(T::deserialize(deserializer)?);
            Ok(())
        } else {
            deserializer.deserialize_seq(self)
        }
    }
}

impl<'de, T: serde::Deserialize<'de>> Visitor<'de> for Nested<'_, T> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a value nested in arrays")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        // Empty: the value itself began with `]`, which closed one of the
        // wrapping arrays; in the body serde_json found no value there.
        seq.next_element_seed(Nested::new(self.depth - 1, self.decoded))?
            .ok_or_else(|| serde::de::Error::custom("expected value"))
    }
}

/// serde_json's error on the value at `range`, placed in the whole body.
fn located(
    s: &Scanner<'_>,
    range: &Range<usize>,
    error: &serde_json::Error,
    shift: usize,
) -> SyntaxError {
    let message = error.to_string();
    let position = format!(" at line {} column {}", error.line(), error.column());
    let message = message
        .strip_suffix(&position)
        .unwrap_or(&message)
        .to_owned();
    let value = &s.bytes()[range.clone()];
    let (line_start, column) = match error.line() {
        0 | 1 => (0, error.column().saturating_sub(shift)),
        line => (
            value
                .iter()
                .enumerate()
                .filter(|&(_, &b)| b == b'\n')
                .nth(line - 2)
                .map_or(0, |(i, _)| i + 1),
            error.column(),
        ),
    };
    // serde_json's column counts the bytes it had read on the line: 0 just
    // after a newline.
    s.error_after(Reason::Field(message), range.start + line_start + column)
}

fn sort_unique(names: &mut Vec<String>) {
    names.sort_unstable();
    names.dedup();
}

#[cfg(test)]
#[path = "decode_tests.rs"]
mod tests;
