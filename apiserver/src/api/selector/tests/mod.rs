//! Tests of the selectors through their public API, with apimachinery's
//! wording for every error: `label` for matching, `label_errors` for
//! rejections, `field` for field selectors.

use std::collections::BTreeMap;

use super::{FieldSelector, LabelSelector, SelectorError};

mod field;
mod label;
mod label_errors;

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
fn selectors_print_in_a_form_that_parses_back_the_same() {
    let labels = [
        ("", ""),
        ("a=b", "a=b"),
        ("a==b,!c,d", "a=b,!c,d"),
        ("x in (b,a),y notin (c)", "x in (a,b),y!=c"),
        ("x in (a,),k>5,k<3", "k>5,k<3,x in (,a)"),
        ("x=", "x="),
    ];
    for (input, printed) in labels {
        let parsed = sel(input);
        assert_eq!(parsed.to_string(), printed, "{input}");
        assert_eq!(sel(printed), parsed, "{printed}");
    }
    let fields = [
        ("", ""),
        (
            r"metadata.name!=b\,c,metadata.name==a\=\\",
            r"metadata.name!=b\,c,metadata.name=a\=\\",
        ),
    ];
    for (input, printed) in fields {
        let parsed = FieldSelector::parse(input).expect(input);
        assert_eq!(parsed.to_string(), printed, "{input}");
        let again = FieldSelector::parse(printed).expect(printed);
        assert_eq!(again.to_string(), printed);
        assert_eq!(again.matches_name("a=\\"), parsed.matches_name("a=\\"));
    }
}
