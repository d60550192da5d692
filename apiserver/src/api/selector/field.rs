//! The field selector: `metadata.name` terms, their escapes and matching.

use std::fmt;
use std::str::FromStr;

use super::SelectorError;

const NAME_FIELD: &str = "metadata.name";

/// A parsed field selector (`?fieldSelector=`).
///
/// Only `metadata.name` is supported, with `=`, `==` and `!=`; terms are
/// comma-separated and ANDed, and empty terms are ignored. Values may escape
/// `\`, `,` and `=` with a backslash. Empty string selects everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    terms: Vec<NameTerm>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct NameTerm {
    value: String,
    equal: bool,
}

impl FieldSelector {
    /// Parses the Kubernetes string form. Empty string selects everything.
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut parts = split_terms(s);
        // apimachinery sorts before parsing, which decides which error wins.
        parts.sort_unstable();
        let mut parsed = Vec::with_capacity(parts.len());
        for part in parts.into_iter().filter(|part| !part.is_empty()) {
            let Some((field, equal, raw)) = split_term(part) else {
                return Err(SelectorError::FieldTerm {
                    selector: s.to_owned(),
                    term: part.to_owned(),
                });
            };
            parsed.push((field, equal, unescape(raw)?));
        }
        // Fields are checked only once every term parses, as in apimachinery.
        let terms = parsed
            .into_iter()
            .map(|(field, equal, value)| {
                if field == NAME_FIELD {
                    Ok(NameTerm { value, equal })
                } else {
                    Err(SelectorError::UnknownField(field.to_owned()))
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { terms })
    }

    /// Matches an object's name.
    pub fn matches_name(&self, name: &str) -> bool {
        self.terms.iter().all(|t| (t.value == name) == t.equal)
    }

    /// When the selector pins exactly one name (metadata.name=X or ==X), that name (lets list/watch go straight to one object).
    ///
    /// Other terms may accompany it; the name is returned only if it satisfies
    /// them all, so the one object's name needs no further filtering. `None`
    /// when nothing is pinned, when the terms contradict each other, or when
    /// the pinned name is empty (no object has it).
    pub fn single_name(&self) -> Option<&str> {
        let name = self.terms.iter().find(|t| t.equal)?.value.as_str();
        (!name.is_empty() && self.matches_name(name)).then_some(name)
    }

    /// Whether the selector selects everything.
    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }
}

/// The Kubernetes string form, escapes included, terms in sorted order: two
/// selectors with the same terms print the same, and [`FieldSelector::parse`]
/// reads it back as those terms.
impl fmt::Display for FieldSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut terms: Vec<String> = self
            .terms
            .iter()
            .map(|term| {
                let mut text = format!("{NAME_FIELD}{}", if term.equal { "=" } else { "!=" });
                for c in term.value.chars() {
                    if matches!(c, '\\' | ',' | '=') {
                        text.push('\\');
                    }
                    text.push(c);
                }
                text
            })
            .collect();
        terms.sort_unstable();
        f.write_str(&terms.join(","))
    }
}

impl FromStr for FieldSelector {
    type Err = SelectorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// Splits on commas not escaped by a backslash, keeping the escapes.
fn split_terms(s: &str) -> Vec<&str> {
    if s.is_empty() {
        return Vec::new();
    }
    let mut terms = Vec::new();
    let mut start = 0;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == ',' {
            terms.push(&s[start..i]);
            start = i + 1;
        }
    }
    terms.push(&s[start..]);
    terms
}

/// Splits at the first operator; `!=` and `==` win over `=` at the same spot
/// so no `=` is left on either side.
fn split_term(term: &str) -> Option<(&str, bool, &str)> {
    term.char_indices().find_map(|(i, _)| {
        let rest = &term[i..];
        [("!=", false), ("==", true), ("=", true)]
            .into_iter()
            .find_map(|(op, equal)| {
                rest.strip_prefix(op)
                    .map(|value| (&term[..i], equal, value))
            })
    })
}

fn unescape(raw: &str) -> Result<String, SelectorError> {
    let mut value = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(escaped @ ('\\' | ',' | '=')) => value.push(escaped),
                Some(other) => return Err(SelectorError::FieldEscape(format!("\\{other}"))),
                None => return Err(SelectorError::FieldEscape("\\".to_owned())),
            },
            ',' | '=' => return Err(SelectorError::FieldUnescaped(c)),
            _ => value.push(c),
        }
    }
    Ok(value)
}
