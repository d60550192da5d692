//! Label and field selectors for list and watch (`?labelSelector=`, `?fieldSelector=`),
//! following apimachinery's grammar, matching rules and error wording
//! (`k8s.io/apimachinery/pkg/labels/selector.go`, `pkg/fields/selector.go`).

use std::collections::{BTreeMap, BTreeSet};
use std::str::FromStr;

use crate::validation::{label_key, label_value};

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

/// A parsed label selector (`?labelSelector=`).
///
/// Supports everything apimachinery's `labels.Parse` does: `k=v`, `k==v`,
/// `k!=v`, `k in (v1,v2)`, `k notin (v1)`, `k`, `!k`, and the integer
/// comparisons `k>n` and `k<n` (which never match an absent or non-integer
/// label). `!=` and `notin` match objects without the key. The one departure
/// is that `k in ()` is rejected, where apimachinery reads it as `k in ("")`;
/// empty list elements, as in `k in (a,)`, still stand for the empty value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// Parses the Kubernetes string form. Empty string selects everything.
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut requirements = Parser::new(s).selector()?;
        // Sorted by key, as apimachinery does.
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(Self { requirements })
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Whether the selector selects everything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }
}

impl FromStr for LabelSelector {
    type Err = SelectorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Requirement {
    key: String,
    op: Op,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    Exists,
    DoesNotExist,
    /// `=`, `==` and `in`.
    In(BTreeSet<String>),
    /// `!=` and `notin`.
    NotIn(BTreeSet<String>),
    Gt(i64),
    Lt(i64),
}

impl Requirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        match (&self.op, value) {
            (Op::Exists, value) => value.is_some(),
            (Op::DoesNotExist, value) => value.is_none(),
            (Op::In(values), Some(value)) => values.contains(value),
            (Op::NotIn(values), Some(value)) => !values.contains(value),
            (Op::NotIn(_), None) => true,
            (Op::Gt(bound), Some(value)) => value.parse::<i64>().is_ok_and(|v| v > *bound),
            (Op::Lt(bound), Some(value)) => value.parse::<i64>().is_ok_and(|v| v < *bound),
            (Op::In(_) | Op::Gt(_) | Op::Lt(_), None) => false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token<'a> {
    End,
    /// Any run of other characters; `in` and `notin` are only keywords
    /// where an operator is expected, so `in in (in)` is valid.
    Ident(&'a str),
    Comma,
    Open,
    Close,
    Bang,
    Equals,
    DoubleEquals,
    NotEquals,
    Greater,
    Less,
}

impl Token<'_> {
    fn literal(&self) -> &str {
        match self {
            Token::End => "",
            Token::Ident(s) => s,
            Token::Comma => ",",
            Token::Open => "(",
            Token::Close => ")",
            Token::Bang => "!",
            Token::Equals => "=",
            Token::DoubleEquals => "==",
            Token::NotEquals => "!=",
            Token::Greater => ">",
            Token::Less => "<",
        }
    }
}

fn is_whitespace(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\n')
}

fn is_special(c: char) -> bool {
    matches!(c, '=' | '!' | '(' | ')' | ',' | '>' | '<')
}

/// Splits like apimachinery's lexer, except that NUL is an ordinary character
/// (Go stops at it, silently ignoring the rest of the selector).
fn tokenize(s: &str) -> Vec<Token<'_>> {
    let mut tokens = Vec::new();
    let mut rest = s;
    loop {
        rest = rest.trim_start_matches(is_whitespace);
        let Some(first) = rest.chars().next() else {
            tokens.push(Token::End);
            return tokens;
        };
        let followed_by_eq = rest.as_bytes().get(1) == Some(&b'=');
        let (token, len) = match first {
            '!' if followed_by_eq => (Token::NotEquals, 2),
            '=' if followed_by_eq => (Token::DoubleEquals, 2),
            '!' => (Token::Bang, 1),
            '=' => (Token::Equals, 1),
            '(' => (Token::Open, 1),
            ')' => (Token::Close, 1),
            ',' => (Token::Comma, 1),
            '>' => (Token::Greater, 1),
            '<' => (Token::Less, 1),
            _ => {
                let end = rest
                    .find(|c| is_whitespace(c) || is_special(c))
                    .unwrap_or(rest.len());
                (Token::Ident(&rest[..end]), end)
            }
        };
        tokens.push(token);
        rest = &rest[len..];
    }
}

/// Recursive descent over apimachinery's grammar; each error message matches
/// the one its parser gives at the same point.
struct Parser<'a> {
    tokens: Vec<Token<'a>>,
    pos: usize,
}

impl<'a> Parser<'a> {
    fn new(s: &'a str) -> Self {
        Self {
            tokens: tokenize(s),
            pos: 0,
        }
    }

    fn peek(&self) -> Token<'a> {
        self.tokens.get(self.pos).copied().unwrap_or(Token::End)
    }

    fn next(&mut self) -> Token<'a> {
        let token = self.peek();
        self.pos += 1;
        token
    }

    fn selector(&mut self) -> Result<Vec<Requirement>, SelectorError> {
        let mut requirements = Vec::new();
        match self.peek() {
            Token::End => return Ok(requirements),
            Token::Ident(_) | Token::Bang => {}
            other => {
                return Err(SelectorError::LabelSyntax(format!(
                    "found '{}', expected: !, identifier, or 'end of string'",
                    other.literal()
                )));
            }
        }
        loop {
            let requirement = self
                .requirement()
                .map_err(SelectorError::LabelRequirement)?;
            requirements.push(requirement);
            match self.next() {
                Token::End => return Ok(requirements),
                Token::Comma => match self.peek() {
                    Token::Ident(_) | Token::Bang => {}
                    other => {
                        return Err(SelectorError::LabelSyntax(format!(
                            "found '{}', expected: identifier after ','",
                            other.literal()
                        )));
                    }
                },
                other => {
                    return Err(SelectorError::LabelSyntax(format!(
                        "found '{}', expected: ',' or 'end of string'",
                        other.literal()
                    )));
                }
            }
        }
    }

    fn requirement(&mut self) -> Result<Requirement, String> {
        let negated = self.peek() == Token::Bang;
        if negated {
            self.next();
        }
        let key = match self.next() {
            Token::Ident(key) => key,
            other => {
                return Err(format!("found '{}', expected: identifier", other.literal()));
            }
        };
        if let Some(problem) = label_key(key) {
            return Err(format!("key: Invalid value: {key:?}: {problem}"));
        }
        let requirement = |op| Requirement {
            key: key.to_owned(),
            op,
        };
        // Whatever follows `!key` is left for the caller to reject.
        if negated {
            return Ok(requirement(Op::DoesNotExist));
        }
        if matches!(self.peek(), Token::End | Token::Comma) {
            return Ok(requirement(Op::Exists));
        }
        let op = match self.next() {
            Token::Ident("in") => Op::In(self.value_set(key)?),
            Token::Ident("notin") => Op::NotIn(self.value_set(key)?),
            Token::Equals | Token::DoubleEquals => Op::In(self.exact_value(key)?),
            Token::NotEquals => Op::NotIn(self.exact_value(key)?),
            Token::Greater => Op::Gt(self.integer_value(key)?),
            Token::Less => Op::Lt(self.integer_value(key)?),
            other => {
                return Err(format!(
                    "found '{}', expected: in, notin, =, ==, !=, gt, lt",
                    other.literal()
                ));
            }
        };
        Ok(requirement(op))
    }

    fn value_set(&mut self, key: &str) -> Result<BTreeSet<String>, String> {
        match self.next() {
            Token::Open => {}
            // apimachinery's wording, missing comma included.
            other => return Err(format!("found '{}' expected: '('", other.literal())),
        }
        match self.peek() {
            Token::Close => {
                return Err(
                    "values: Invalid value: []: for 'in', 'notin' operators, values \
                            set can't be empty"
                        .to_owned(),
                );
            }
            Token::Ident(_) | Token::Comma => {}
            other => {
                return Err(format!(
                    "found '{}', expected: ',', ')' or identifier",
                    other.literal()
                ));
            }
        }
        let mut values = BTreeSet::new();
        loop {
            // An element is one identifier or nothing (the empty value).
            let element = match self.peek() {
                Token::Ident(value) => {
                    self.next();
                    Some(value)
                }
                _ => None,
            };
            values.insert(element.unwrap_or_default().to_owned());
            match self.next() {
                Token::Comma => {}
                Token::Close => break,
                other if element.is_some() => {
                    return Err(format!("found '{}', expected: ',' or ')'", other.literal()));
                }
                other => {
                    return Err(format!(
                        "found '{}', expected: ',', or identifier",
                        other.literal()
                    ));
                }
            }
        }
        validate_values(key, &values)?;
        Ok(values)
    }

    /// The value after `=`, `==`, `!=`, `>` or `<`; nothing means the empty value.
    fn raw_exact_value(&mut self) -> Result<&'a str, String> {
        if matches!(self.peek(), Token::End | Token::Comma) {
            return Ok("");
        }
        match self.next() {
            Token::Ident(value) => Ok(value),
            other => Err(format!("found '{}', expected: identifier", other.literal())),
        }
    }

    fn exact_value(&mut self, key: &str) -> Result<BTreeSet<String>, String> {
        let values = BTreeSet::from([self.raw_exact_value()?.to_owned()]);
        validate_values(key, &values)?;
        Ok(values)
    }

    fn integer_value(&mut self, key: &str) -> Result<i64, String> {
        let raw = self.raw_exact_value()?;
        // Same syntax as Go's strconv.ParseInt(raw, 10, 64): optional sign, digits.
        let Ok(value) = raw.parse::<i64>() else {
            return Err(format!(
                "values[0]: Invalid value: {raw:?}: for 'Gt', 'Lt' operators, the value must \
                 be an integer"
            ));
        };
        // A sign is not a valid label value, so apimachinery rejects `k>-1`.
        validate_values(key, &BTreeSet::from([raw.to_owned()]))?;
        Ok(value)
    }
}

fn validate_values(key: &str, values: &BTreeSet<String>) -> Result<(), String> {
    for (index, value) in values.iter().enumerate() {
        if let Some(problem) = label_value(value) {
            return Err(format!(
                "values[{index}][{key}]: Invalid value: {value:?}: {problem}"
            ));
        }
    }
    Ok(())
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn sel(s: &str) -> LabelSelector {
        LabelSelector::parse(s).unwrap_or_else(|e| panic!("{s:?} should parse: {e}"))
    }

    fn label_err(s: &str) -> String {
        match LabelSelector::parse(s) {
            Ok(parsed) => panic!("{s:?} should not parse, got {parsed:?}"),
            Err(e) => e.to_string(),
        }
    }

    fn field(s: &str) -> FieldSelector {
        FieldSelector::parse(s).unwrap_or_else(|e| panic!("{s:?} should parse: {e}"))
    }

    fn field_err(s: &str) -> SelectorError {
        match FieldSelector::parse(s) {
            Ok(parsed) => panic!("{s:?} should not parse, got {parsed:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn empty_label_selector_selects_everything() {
        for s in ["", " ", "\t\r\n "] {
            let selector = sel(s);
            assert!(selector.is_empty());
            assert!(selector.matches(&labels(&[])));
            assert!(selector.matches(&labels(&[("a", "b")])));
        }
        assert!(LabelSelector::default().is_empty());
        assert!(!sel("a").is_empty());
    }

    #[test]
    fn equality() {
        for s in ["a=b", "a==b", " a = b ", "a\t==\nb"] {
            let selector = sel(s);
            assert!(selector.matches(&labels(&[("a", "b")])), "{s}");
            assert!(selector.matches(&labels(&[("a", "b"), ("c", "d")])), "{s}");
            assert!(!selector.matches(&labels(&[("a", "c")])), "{s}");
            assert!(!selector.matches(&labels(&[])), "{s}");
        }
        assert_eq!(sel("a=b"), sel("a==b"));
    }

    #[test]
    fn inequality_matches_absent_key() {
        let selector = sel("a!=b");
        assert!(!selector.matches(&labels(&[("a", "b")])));
        assert!(selector.matches(&labels(&[("a", "c")])));
        assert!(selector.matches(&labels(&[])));
    }

    #[test]
    fn missing_exact_value_is_the_empty_value() {
        let selector = sel("a=");
        assert!(selector.matches(&labels(&[("a", "")])));
        assert!(!selector.matches(&labels(&[("a", "x")])));
        assert!(!selector.matches(&labels(&[])));
        let selector = sel("a!=,b");
        assert!(selector.matches(&labels(&[("a", "x"), ("b", "")])));
        assert!(!selector.matches(&labels(&[("a", ""), ("b", "")])));
    }

    #[test]
    fn set_based() {
        let selector = sel("env in (prod, staging)");
        assert!(selector.matches(&labels(&[("env", "prod")])));
        assert!(selector.matches(&labels(&[("env", "staging")])));
        assert!(!selector.matches(&labels(&[("env", "dev")])));
        assert!(!selector.matches(&labels(&[])));

        let selector = sel("env notin (prod)");
        assert!(!selector.matches(&labels(&[("env", "prod")])));
        assert!(selector.matches(&labels(&[("env", "dev")])));
        assert!(selector.matches(&labels(&[])));

        assert_eq!(sel("a in(x,y)"), sel("a in (y , x)"));
        assert_eq!(sel("a in (x)"), sel("a=x"));
        assert_eq!(sel("a notin (x)"), sel("a!=x"));
        assert_eq!(sel("a in (x,x)"), sel("a in (x)"));
    }

    #[test]
    fn empty_list_elements_are_the_empty_value() {
        for s in ["a in (x,)", "a in (,x)", "a in (x,,)", "a in (x,,x)"] {
            let selector = sel(s);
            assert!(selector.matches(&labels(&[("a", "x")])), "{s}");
            assert!(selector.matches(&labels(&[("a", "")])), "{s}");
            assert!(!selector.matches(&labels(&[("a", "y")])), "{s}");
        }
        assert_eq!(sel("a in (,)"), sel("a="));
    }

    #[test]
    fn existence() {
        let selector = sel("a");
        assert!(selector.matches(&labels(&[("a", "")])));
        assert!(!selector.matches(&labels(&[("b", "")])));

        let selector = sel("!a");
        assert!(!selector.matches(&labels(&[("a", "")])));
        assert!(selector.matches(&labels(&[("b", "")])));
        assert_eq!(sel(" ! a "), selector);
    }

    #[test]
    fn terms_are_anded() {
        let selector = sel("tier=db, env in (prod,staging), !legacy, owner, ver notin (1)");
        let base = [("tier", "db"), ("env", "prod"), ("owner", "x")];
        assert!(selector.matches(&labels(&base)));
        assert!(selector.matches(&labels(&[("ver", "2"), base[0], base[1], base[2]])));
        assert!(!selector.matches(&labels(&[("ver", "1"), base[0], base[1], base[2]])));
        assert!(!selector.matches(&labels(&[("legacy", ""), base[0], base[1], base[2]])));
        assert!(!selector.matches(&labels(&base[..2])));
        assert!(!selector.matches(&labels(&[("tier", "web"), base[1], base[2]])));
        assert!(sel("a=b,c!=d,e").matches(&labels(&[("a", "b"), ("e", "f")])));
    }

    #[test]
    fn term_order_does_not_matter() {
        assert_eq!(sel("b=2,a=1,!c"), sel("!c,a=1,b=2"));
    }

    #[test]
    fn keywords_are_identifiers_outside_operator_position() {
        let selector = sel("in in (in, notin)");
        assert!(selector.matches(&labels(&[("in", "notin")])));
        assert!(!selector.matches(&labels(&[("in", "x")])));
        assert!(sel("notin=in").matches(&labels(&[("notin", "in")])));
        assert!(sel("notin").matches(&labels(&[("notin", "")])));
        assert!(sel("!in").matches(&labels(&[])));
        assert!(sel("a notin (notin)").matches(&labels(&[("a", "in")])));
    }

    #[test]
    fn prefixed_keys_and_valid_values() {
        let selector = sel("app.kubernetes.io/name=Postgre_SQL-1.2");
        assert!(selector.matches(&labels(&[("app.kubernetes.io/name", "Postgre_SQL-1.2")])));
        assert!(
            sel(&format!("{}={}", "k".repeat(63), "v".repeat(63))).matches(&labels(&[(
                "k".repeat(63).as_str(),
                "v".repeat(63).as_str()
            )]))
        );
    }

    #[test]
    fn greater_and_less_than() {
        let gt = sel("replicas>3");
        assert!(gt.matches(&labels(&[("replicas", "4")])));
        assert!(!gt.matches(&labels(&[("replicas", "3")])));
        assert!(!gt.matches(&labels(&[("replicas", "-7")])));
        assert!(!gt.matches(&labels(&[("replicas", "many")])));
        assert!(!gt.matches(&labels(&[("replicas", "")])));
        assert!(!gt.matches(&labels(&[("replicas", "99999999999999999999")])));
        assert!(!gt.matches(&labels(&[])));
        assert!(gt.matches(&labels(&[("replicas", "+10")])));

        let lt = sel("replicas < 10");
        assert!(lt.matches(&labels(&[("replicas", "9")])));
        assert!(lt.matches(&labels(&[("replicas", "-9")])));
        assert!(!lt.matches(&labels(&[("replicas", "10")])));
        assert!(!lt.matches(&labels(&[])));

        assert!(sel("a>0,a<2").matches(&labels(&[("a", "1")])));
        assert!(sel(&format!("a<{}", i64::MAX)).matches(&labels(&[("a", "0")])));
    }

    #[test]
    fn empty_terms_are_rejected() {
        assert_eq!(
            label_err("a=b,,c=d"),
            "found ',', expected: identifier after ','"
        );
        assert_eq!(
            label_err("a=b,"),
            "found '', expected: identifier after ','"
        );
        assert_eq!(
            label_err("a=b, ,"),
            "found ',', expected: identifier after ','"
        );
        assert_eq!(
            label_err(",a=b"),
            "found ',', expected: !, identifier, or 'end of string'"
        );
        assert_eq!(
            label_err(","),
            "found ',', expected: !, identifier, or 'end of string'"
        );
    }

    #[test]
    fn stray_tokens_are_rejected() {
        for (s, found) in [
            (")", ")"),
            ("(", "("),
            ("=a", "="),
            ("!=a", "!="),
            (">1", ">"),
        ] {
            assert_eq!(
                label_err(s),
                format!("found '{found}', expected: !, identifier, or 'end of string'"),
            );
        }
        for (s, found) in [
            ("a=b=c", "="),
            ("a=b c", "c"),
            ("a=b)", ")"),
            ("a in (x))", ")"),
            ("!a=b", "="),
            ("!a in (x)", "in"),
            ("!a b", "b"),
        ] {
            assert_eq!(
                label_err(s),
                format!("found '{found}', expected: ',' or 'end of string'"),
                "{s}"
            );
        }
    }

    #[test]
    fn missing_key_is_rejected() {
        assert_eq!(
            label_err("!"),
            "unable to parse requirement: found '', expected: identifier"
        );
        assert_eq!(
            label_err(" ! "),
            "unable to parse requirement: found '', expected: identifier"
        );
        assert_eq!(
            label_err("!!a"),
            "unable to parse requirement: found '!', expected: identifier"
        );
        assert_eq!(
            label_err("!,a"),
            "unable to parse requirement: found ',', expected: identifier"
        );
        assert_eq!(
            label_err("a,!"),
            "unable to parse requirement: found '', expected: identifier"
        );
    }

    #[test]
    fn bad_operators_are_rejected() {
        for (s, found) in [
            ("a b", "b"),
            ("a (x)", "("),
            ("a ! b", "!"),
            ("a )", ")"),
            ("ain (x)", "("),
        ] {
            assert_eq!(
                label_err(s),
                format!(
                    "unable to parse requirement: found '{found}', expected: in, notin, =, ==, \
                     !=, gt, lt"
                ),
                "{s}"
            );
        }
        // The second `in` stands where `(` belongs.
        assert_eq!(
            label_err("a in in (x)"),
            "unable to parse requirement: found 'in' expected: '('"
        );
    }

    #[test]
    fn bad_exact_values_are_rejected() {
        for (s, found) in [
            ("a=(b)", "("),
            ("a===b", "="),
            ("a=!b", "!"),
            ("a<>1", ">"),
            ("a!=)", ")"),
        ] {
            assert_eq!(
                label_err(s),
                format!("unable to parse requirement: found '{found}', expected: identifier"),
                "{s}"
            );
        }
    }

    #[test]
    fn bad_value_sets_are_rejected() {
        let cases = [
            ("a in", "found '' expected: '('"),
            ("a notin x", "found 'x' expected: '('"),
            ("a in )", "found ')' expected: '('"),
            ("a in (x", "found '', expected: ',' or ')'"),
            ("a in (x y)", "found 'y', expected: ',' or ')'"),
            ("a in (x=y)", "found '=', expected: ',' or ')'"),
            ("a in (", "found '', expected: ',', ')' or identifier"),
            ("a in (=)", "found '=', expected: ',', ')' or identifier"),
            ("a in ((x))", "found '(', expected: ',', ')' or identifier"),
            ("a in (x,=)", "found '=', expected: ',', or identifier"),
            ("a in (x,", "found '', expected: ',', or identifier"),
            ("a in (,(", "found '(', expected: ',', or identifier"),
            (
                "a in ()",
                "values: Invalid value: []: for 'in', 'notin' operators, values set can't be empty",
            ),
            (
                "a notin ( )",
                "values: Invalid value: []: for 'in', 'notin' operators, values set can't be empty",
            ),
        ];
        for (s, message) in cases {
            assert_eq!(
                label_err(s),
                format!("unable to parse requirement: {message}"),
                "{s}"
            );
        }
    }

    #[test]
    fn invalid_keys_are_rejected() {
        for key in [
            "-a",
            "a-",
            "ключ",
            "a/b/c",
            "/a",
            "UPPER.example/x",
            "a\0",
            &"k".repeat(64),
        ] {
            let problem = label_key(key).expect("test key is invalid");
            let expected =
                format!("unable to parse requirement: key: Invalid value: {key:?}: {problem}");
            for s in [
                format!("{key}=v"),
                format!("!{key}"),
                format!("{key} in (v)"),
                key.to_owned(),
            ] {
                assert_eq!(label_err(&s), expected, "{s}");
            }
        }
        assert_eq!(
            label_err("a,-b"),
            format!(
                "unable to parse requirement: key: Invalid value: \"-b\": {}",
                label_key("-b").unwrap_or_default()
            )
        );
    }

    #[test]
    fn invalid_values_are_rejected() {
        for value in ["-v", "v-", "значение", "a/b", "v\0", &"v".repeat(64)] {
            let problem = label_value(value).expect("test value is invalid");
            let expected = format!(
                "unable to parse requirement: values[0][k]: Invalid value: {value:?}: {problem}"
            );
            for s in [
                format!("k={value}"),
                format!("k!={value}"),
                format!("k in ({value})"),
            ] {
                assert_eq!(label_err(&s), expected, "{s}");
            }
        }
        // Indices follow the sorted value set, as in apimachinery.
        let problem = label_value("b@d").unwrap_or_default();
        assert_eq!(
            label_err("k notin (ok, b@d)"),
            format!("unable to parse requirement: values[0][k]: Invalid value: \"b@d\": {problem}")
        );
        assert_eq!(
            label_err("k in (a, z@)"),
            format!(
                "unable to parse requirement: values[1][k]: Invalid value: \"z@\": {}",
                label_value("z@").unwrap_or_default()
            )
        );
    }

    #[test]
    fn comparisons_need_integer_label_values() {
        for raw in ["x", "", "1.5", "0x10", "1_000", "99999999999999999999"] {
            let expected = format!(
                "unable to parse requirement: values[0]: Invalid value: {raw:?}: for 'Gt', 'Lt' \
                 operators, the value must be an integer"
            );
            assert_eq!(label_err(&format!("a>{raw}")), expected, "{raw}");
            assert_eq!(label_err(&format!("a<{raw}")), expected, "{raw}");
        }
        // Integers, but not valid label values.
        for raw in ["-1", "+1"] {
            assert_eq!(
                label_err(&format!("a>{raw}")),
                format!(
                    "unable to parse requirement: values[0][a]: Invalid value: {raw:?}: {}",
                    label_value(raw).unwrap_or_default()
                )
            );
        }
        assert_eq!(
            label_err("a>(1)"),
            "unable to parse requirement: found '(', expected: identifier"
        );
    }

    #[test]
    fn error_variants() {
        assert!(matches!(
            LabelSelector::parse("a=b,,c"),
            Err(SelectorError::LabelSyntax(_))
        ));
        assert!(matches!(
            LabelSelector::parse("a in ()"),
            Err(SelectorError::LabelRequirement(_))
        ));
        assert_eq!("a=b".parse::<LabelSelector>(), LabelSelector::parse("a=b"));
    }

    #[test]
    fn label_parser_never_panics() {
        const ALPHABET: [char; 14] = [
            'a', 'i', 'n', '!', '=', '(', ')', ',', '<', '>', ' ', 'é', '\0', '1',
        ];
        let samples = [
            labels(&[]),
            labels(&[("a", "")]),
            labels(&[("a", "a"), ("in", "1")]),
            labels(&[("a", "1"), ("n", "in"), ("ain", "a")]),
        ];
        // Every string of up to four characters from ALPHABET.
        let mut count = 0;
        let mut accepted = 0;
        let mut indices = [0_usize; 4];
        for len in 0..=4 {
            let combos = ALPHABET.len().pow(len as u32);
            for n in 0..combos {
                let mut rest = n;
                for slot in indices.iter_mut().take(len) {
                    *slot = rest % ALPHABET.len();
                    rest /= ALPHABET.len();
                }
                let s: String = indices[..len].iter().map(|&i| ALPHABET[i]).collect();
                count += 1;
                if let Ok(selector) = LabelSelector::parse(&s) {
                    accepted += 1;
                    for sample in &samples {
                        let _ = selector.matches(sample);
                    }
                }
            }
        }
        assert!(count > 40_000);
        assert!(accepted > 0);
    }

    #[test]
    fn empty_field_selector_selects_everything() {
        for s in ["", ",", ",,"] {
            let selector = field(s);
            assert!(selector.is_empty(), "{s:?}");
            assert!(selector.matches_name("anything"));
            assert_eq!(selector.single_name(), None);
        }
        assert!(FieldSelector::default().is_empty());
    }

    #[test]
    fn field_equality_pins_a_name() {
        for s in [
            "metadata.name=foo",
            "metadata.name==foo",
            "metadata.name=foo,",
            ",metadata.name=foo",
        ] {
            let selector = field(s);
            assert!(!selector.is_empty());
            assert!(selector.matches_name("foo"), "{s}");
            assert!(!selector.matches_name("bar"), "{s}");
            assert_eq!(selector.single_name(), Some("foo"), "{s}");
        }
    }

    #[test]
    fn field_inequality() {
        let selector = field("metadata.name!=foo");
        assert!(!selector.matches_name("foo"));
        assert!(selector.matches_name("bar"));
        assert_eq!(selector.single_name(), None);

        let selector = field("metadata.name!=foo,metadata.name!=bar");
        assert!(!selector.matches_name("foo"));
        assert!(!selector.matches_name("bar"));
        assert!(selector.matches_name("baz"));
        assert_eq!(selector.single_name(), None);
    }

    #[test]
    fn field_terms_are_anded() {
        let selector = field("metadata.name=foo,metadata.name!=bar");
        assert!(selector.matches_name("foo"));
        assert!(!selector.matches_name("bar"));
        assert_eq!(selector.single_name(), Some("foo"));

        let selector = field("metadata.name=foo,metadata.name==foo");
        assert_eq!(selector.single_name(), Some("foo"));

        for contradiction in [
            "metadata.name=foo,metadata.name!=foo",
            "metadata.name=a,metadata.name=b",
        ] {
            let selector = field(contradiction);
            assert!(!selector.matches_name("foo"));
            assert!(!selector.matches_name("a"));
            assert!(!selector.matches_name("b"));
            assert_eq!(selector.single_name(), None, "{contradiction}");
        }
    }

    #[test]
    fn empty_field_value() {
        let selector = field("metadata.name=");
        assert!(!selector.matches_name("foo"));
        assert!(selector.matches_name(""));
        assert_eq!(selector.single_name(), None);
        assert!(field("metadata.name!=").matches_name("foo"));
    }

    #[test]
    fn field_escapes() {
        assert_eq!(field(r"metadata.name=a\,b").single_name(), Some("a,b"));
        assert_eq!(field(r"metadata.name=a\=b").single_name(), Some("a=b"));
        assert_eq!(field(r"metadata.name=a\\b").single_name(), Some(r"a\b"));
        assert_eq!(
            field(r"metadata.name=a\\,metadata.name!=b").single_name(),
            Some(r"a\")
        );
        assert_eq!(field("metadata.name=é").single_name(), Some("é"));
        assert_eq!(
            field_err(r"metadata.name=a\x").to_string(),
            r"invalid field selector: invalid escape sequence: \x"
        );
        assert_eq!(
            field_err(r"metadata.name=a\é").to_string(),
            r"invalid field selector: invalid escape sequence: \é"
        );
        assert_eq!(
            field_err(r"metadata.name=a\").to_string(),
            r"invalid field selector: invalid escape sequence: \"
        );
        assert_eq!(
            field_err("metadata.name=a=b").to_string(),
            "invalid field selector: unescaped character in value: '='"
        );
        assert_eq!(
            field_err("metadata.name!==a"),
            SelectorError::FieldUnescaped('=')
        );
        assert_eq!(
            field_err("metadata.name===a"),
            SelectorError::FieldUnescaped('=')
        );
    }

    #[test]
    fn unknown_fields_are_rejected() {
        assert_eq!(
            field_err("spec.foo=bar").to_string(),
            r#""spec.foo" is not a known field selector: only "metadata.name""#
        );
        for (s, name) in [
            ("metadata.namespace=x", "metadata.namespace"),
            (" metadata.name=x", " metadata.name"),
            ("metadata.name=x, metadata.name=x", " metadata.name"),
            ("=x", ""),
            ("Metadata.Name!=x", "Metadata.Name"),
        ] {
            assert_eq!(
                field_err(s),
                SelectorError::UnknownField(name.to_owned()),
                "{s}"
            );
        }
    }

    #[test]
    fn field_terms_without_operator_are_rejected() {
        assert_eq!(
            field_err("metadata.name=a,foo").to_string(),
            "invalid selector: 'metadata.name=a,foo'; can't understand 'foo'"
        );
        assert_eq!(
            field_err("metadata.name!x"),
            SelectorError::FieldTerm {
                selector: "metadata.name!x".to_owned(),
                term: "metadata.name!x".to_owned(),
            }
        );
    }

    #[test]
    fn field_syntax_errors_win_over_unknown_fields() {
        assert_eq!(
            field_err(r"spec.x=a,metadata.name=\q"),
            SelectorError::FieldEscape(r"\q".to_owned())
        );
        assert!(matches!(
            field_err("spec.x=a,garbage"),
            SelectorError::FieldTerm { .. }
        ));
        assert_eq!(
            "metadata.name=a".parse::<FieldSelector>(),
            FieldSelector::parse("metadata.name=a")
        );
    }

    #[test]
    fn field_parser_never_panics() {
        const ALPHABET: [char; 8] = ['m', '=', '!', ',', '\\', 'é', ' ', '\0'];
        let mut count = 0;
        for len in 0..=5_u32 {
            for n in 0..ALPHABET.len().pow(len) {
                let mut rest = n;
                let mut s = String::new();
                for _ in 0..len {
                    s.push(ALPHABET[rest % ALPHABET.len()]);
                    rest /= ALPHABET.len();
                }
                count += 1;
                if let Ok(selector) = FieldSelector::parse(&s) {
                    let _ = selector.matches_name("m");
                    let _ = selector.single_name();
                }
                let _ = FieldSelector::parse(&format!("metadata.name={s}"));
            }
        }
        assert!(count > 30_000);
    }
}
