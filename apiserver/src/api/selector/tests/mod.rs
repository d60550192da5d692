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
