//! Field selectors: what they match, the name they pin, what they reject.

use super::{FieldSelector, SelectorError, field, field_err};

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
