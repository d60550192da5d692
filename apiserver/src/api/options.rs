//! The options of lists and watches, from the query string: selectors,
//! paging (`limit` and `continue`), resourceVersion, watch settings and
//! `includeObject`.

use std::time::Duration;

use axum::extract::Query;
use axum::extract::rejection::QueryRejection;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};

use super::selector::{FieldSelector, LabelSelector, SelectorError};
use super::status::ApiError;
use super::table::IncludeObject;
use crate::v1alpha1::Plugin;

/// Query parameters of list and watch, as sent on the wire.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListQuery {
    label_selector: Option<String>,
    field_selector: Option<String>,
    limit: Option<String>,
    #[serde(rename = "continue")]
    continue_token: Option<String>,
    resource_version: Option<String>,
    resource_version_match: Option<String>,
    watch: Option<String>,
    timeout_seconds: Option<String>,
    allow_watch_bookmarks: Option<String>,
    send_initial_events: Option<String>,
    include_object: Option<String>,
}

/// Validated list and watch options.
#[derive(Debug)]
pub struct ListOptions {
    pub label_selector: LabelSelector,
    pub field_selector: FieldSelector,
    pub limit: Option<usize>,
    pub start_after: Option<String>,
    pub resource_version: Option<u64>,
    pub watch: bool,
    pub timeout: Option<Duration>,
    pub allow_bookmarks: bool,
    pub send_initial_events: Option<bool>,
    pub include_object: IncludeObject,
}

impl ListOptions {
    /// True when `plugin` passes both selectors.
    pub fn selects(&self, plugin: &Plugin) -> bool {
        if self.field_selector.is_empty() && self.label_selector.is_empty() {
            return true;
        }
        self.field_selector.matches_name(plugin.name())
            && self.label_selector.matches(
                plugin
                    .metadata
                    .labels
                    .as_ref()
                    .unwrap_or(&Default::default()),
            )
    }
}

fn parse_bool(name: &str, value: Option<&str>) -> Result<Option<bool>, ApiError> {
    match value {
        None | Some("") => Ok(None),
        Some("true" | "1") => Ok(Some(true)),
        Some("false" | "0") => Ok(Some(false)),
        Some(other) => Err(ApiError::BadRequest(format!(
            "{name}: Invalid value: {other:?}: must be true or false"
        ))),
    }
}

/// Parses a resourceVersion: kplug's are decimal counters; "0" means "any".
pub fn parse_resource_version(value: Option<&str>) -> Result<Option<u64>, ApiError> {
    match value {
        None | Some("") | Some("0") => Ok(None),
        Some(rv) => rv.parse().map(Some).map_err(|_| {
            ApiError::BadRequest(format!(
                "resourceVersion: Invalid value: {rv:?}: must be a decimal resource version"
            ))
        }),
    }
}

/// The opaque `continue` token: where the next page starts.
#[derive(Serialize, Deserialize)]
struct ContinueToken {
    /// resourceVersion of the list that issued the token (informational).
    rv: u64,
    /// The last name on the previous page.
    start: String,
}

fn decode_continue(token: &str) -> Result<String, ApiError> {
    let invalid = |why: String| ApiError::BadRequest(format!("continue key is not valid: {why}"));
    let bytes = URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|e| invalid(e.to_string()))?;
    let token: ContinueToken =
        serde_json::from_slice(&bytes).map_err(|e| invalid(e.to_string()))?;
    Ok(token.start)
}

pub fn encode_continue(rv: u64, start: &str) -> String {
    let token = ContinueToken {
        rv,
        start: start.to_owned(),
    };
    // Serializing a struct of a number and a string cannot fail.
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(&token).unwrap_or_default())
}

impl TryFrom<ListQuery> for ListOptions {
    type Error = ApiError;

    fn try_from(query: ListQuery) -> Result<Self, ApiError> {
        let bad = |e: SelectorError| ApiError::BadRequest(e.to_string());
        let label_selector =
            LabelSelector::parse(query.label_selector.as_deref().unwrap_or_default())
                .map_err(bad)?;
        let field_selector =
            FieldSelector::parse(query.field_selector.as_deref().unwrap_or_default())
                .map_err(bad)?;
        let limit = match query.limit.as_deref() {
            None | Some("") => None,
            Some(limit) => match limit.parse::<i64>() {
                Ok(n) if n > 0 => usize::try_from(n).ok(),
                Ok(_) => None,
                Err(_) => {
                    return Err(ApiError::BadRequest(format!(
                        "limit: Invalid value: {limit:?}: must be an integer"
                    )));
                }
            },
        };
        let start_after = match query.continue_token.as_deref() {
            None | Some("") => None,
            Some(token) => Some(decode_continue(token)?),
        };
        if let Some(m) = query.resource_version_match.as_deref()
            && !matches!(m, "" | "NotOlderThan" | "Exact")
        {
            return Err(ApiError::BadRequest(format!(
                "resourceVersionMatch: Unsupported value: {m:?}: supported values: \"Exact\", \"NotOlderThan\""
            )));
        }
        let timeout = match query.timeout_seconds.as_deref() {
            None | Some("") => None,
            Some(t) => match t.parse::<u64>() {
                Ok(seconds) => Some(Duration::from_secs(seconds)),
                Err(_) => {
                    return Err(ApiError::BadRequest(format!(
                        "timeoutSeconds: Invalid value: {t:?}: must be a non-negative integer"
                    )));
                }
            },
        };
        Ok(Self {
            label_selector,
            field_selector,
            limit,
            start_after,
            resource_version: parse_resource_version(query.resource_version.as_deref())?,
            watch: parse_bool("watch", query.watch.as_deref())?.unwrap_or(false),
            timeout,
            allow_bookmarks: parse_bool(
                "allowWatchBookmarks",
                query.allow_watch_bookmarks.as_deref(),
            )?
            .unwrap_or(false),
            send_initial_events: parse_bool(
                "sendInitialEvents",
                query.send_initial_events.as_deref(),
            )?,
            include_object: IncludeObject::parse(query.include_object.as_deref())?,
        })
    }
}

/// The options of a request, or the `400` its query deserves.
pub fn query_options(
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<ListOptions, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    ListOptions::try_from(query)
}

/// `resourceVersion` newer than the registry's: like kube-apiserver, a `504`
/// that clients retry.
pub fn check_not_too_large(requested: Option<u64>, current: u64) -> Result<(), ApiError> {
    match requested {
        Some(rv) if rv > current => Err(ApiError::Timeout(format!(
            "Too large resource version: {rv}, current: {current}"
        ))),
        _ => Ok(()),
    }
}
