//! Label selectors that are rejected, and the message for each.

use super::{LabelSelector, SelectorError, label_err, labels};
use kplug_api::validation::{label_key, label_value};

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
