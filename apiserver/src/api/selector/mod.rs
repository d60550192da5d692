//! Label and field selectors for list and watch (`?labelSelector=`, `?fieldSelector=`),
//! following apimachinery's grammar, matching rules and error wording
//! (`k8s.io/apimachinery/pkg/labels/selector.go`, `pkg/fields/selector.go`).
//!
//! Pure parsing and matching, no IO: `label` holds the label selector and its
//! matching, `lexer` and `parser` its grammar, `field` the field selector.

mod field;
mod label;
mod lexer;
mod parser;
#[cfg(test)]
mod tests;

pub use field::FieldSelector;
pub use label::LabelSelector;

/// Why a selector was rejected; messages are worded as apimachinery's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// A label selector is malformed between requirements, e.g. an empty term.
    #[error("{0}")]
    LabelSyntax(String),
    /// One label requirement is malformed or has an invalid key or value.
    #[error("unable to parse requirement: {0}")]
    LabelRequirement(String),
    /// A field selector term has no `=`, `==` or `!=`.
    #[error("invalid selector: '{selector}'; can't understand '{term}'")]
    FieldTerm {
        /// The whole selector.
        selector: String,
        /// The term that could not be understood.
        term: String,
    },
    /// A field selector value has a `\` not followed by `\`, `,` or `=`.
    #[error("invalid field selector: invalid escape sequence: {0}")]
    FieldEscape(String),
    /// A field selector value has a bare `,` or `=`.
    #[error("invalid field selector: unescaped character in value: {0:?}")]
    FieldUnescaped(char),
    /// A field selector names a field other than `metadata.name`.
    #[error("{0:?} is not a known field selector: only \"metadata.name\"")]
    UnknownField(String),
}
