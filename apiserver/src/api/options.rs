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
use crate::registry::{Encoded, Registry, RequestedVersion};

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
    /// The `continue` token's resourceVersion: the list it continues.
    pub continue_version: Option<String>,
    /// As sent; "0" (any version) is `None`. See [`place`].
    pub resource_version: Option<String>,
    pub watch: bool,
    pub timeout: Option<Duration>,
    pub allow_bookmarks: bool,
    pub send_initial_events: Option<bool>,
    pub include_object: IncludeObject,
}

impl ListOptions {
    /// True when the version stored in `encoded` passes both selectors. Its
    /// name and labels are read from the JSON only when there is a selector.
    pub fn selects(&self, encoded: &Encoded) -> bool {
        if self.field_selector.is_empty() && self.label_selector.is_empty() {
            return true;
        }
        encoded.head().is_some_and(|head| {
            self.field_selector.matches_name(&head.name)
                && self.label_selector.matches_with(|key| head.label(key))
        })
    }

    /// [`ListOptions::selects`] for the plugin registered as `name`: a field
    /// selector, which only knows the name, then needs nothing read back.
    pub fn selects_named(&self, name: &str, encoded: &Encoded) -> bool {
        if !self.field_selector.matches_name(name) {
            return false;
        }
        self.label_selector.is_empty()
            || encoded
                .head()
                .is_some_and(|head| self.label_selector.matches_with(|key| head.label(key)))
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

/// Where a client's resourceVersion falls in this process's history: `400`
/// for one kplug cannot have issued. `None` means "any" ("0" or absent).
pub fn place(
    registry: &Registry,
    requested: Option<&str>,
) -> Result<Option<RequestedVersion>, ApiError> {
    requested
        .map(|rv| registry.place(rv))
        .transpose()
        .map_err(|invalid| ApiError::BadRequest(invalid.to_string()))
}

/// The opaque `continue` token: where the next page starts.
#[derive(Serialize, Deserialize)]
struct ContinueToken {
    /// resourceVersion of the list that issued the token: a token from
    /// another kplug process is refused, since its names may not line up.
    rv: String,
    /// The last name on the previous page.
    start: String,
}

/// The continued list's resourceVersion and the name to start after.
fn decode_continue(token: &str) -> Result<(String, String), ApiError> {
    let invalid = |why: String| ApiError::BadRequest(format!("continue key is not valid: {why}"));
    let bytes = URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|e| invalid(e.to_string()))?;
    let token: ContinueToken =
        serde_json::from_slice(&bytes).map_err(|e| invalid(e.to_string()))?;
    Ok((token.rv, token.start))
}

pub fn encode_continue(rv: String, start: &str) -> String {
    let token = ContinueToken {
        rv,
        start: start.to_owned(),
    };
    // Serializing a struct of two strings cannot fail.
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
        let (continue_version, start_after) = match query.continue_token.as_deref() {
            None | Some("") => (None, None),
            Some(token) => {
                let (rv, start) = decode_continue(token)?;
                (Some(rv), Some(start))
            }
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
            continue_version,
            resource_version: query
                .resource_version
                .filter(|rv| !rv.is_empty() && rv != "0"),
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

/// Checks that a list can be served at the registry's `current` version:
/// a `resourceVersion` newer than it is, as in kube-apiserver, a `504` that
/// clients retry; one from another kplug process, or a `continue` token
/// from one, is `410 Expired`, on which clients relist from scratch.
pub fn check_list_version(
    registry: &Registry,
    options: &ListOptions,
    current: u64,
) -> Result<(), ApiError> {
    let continues_foreign = options
        .continue_version
        .as_deref()
        .is_some_and(|rv| matches!(registry.place(rv), Ok(RequestedVersion::Foreign(_))));
    if continues_foreign {
        return Err(ApiError::Expired(CONTINUE_EXPIRED.to_owned()));
    }
    match place(registry, options.resource_version.as_deref())? {
        Some(RequestedVersion::Local(rv)) if rv > current => Err(ApiError::Timeout(format!(
            "Too large resource version: {}, current: {}",
            registry.version(rv),
            registry.version(current)
        ))),
        Some(RequestedVersion::Foreign(foreign)) => Err(ApiError::Expired(foreign.to_string())),
        _ => Ok(()),
    }
}

/// kube-apiserver's words for a `continue` token it can no longer serve.
const CONTINUE_EXPIRED: &str = "The provided continue parameter is too old to display a \
                                consistent list result. You can start a new list without the \
                                continue parameter.";
