//! Server-side selection: which live plugin serves a request.
//!
//! The rules, in order (documented in the README, never random):
//! 1. `plugin` names one: that plugin (reason `Requested`).
//! 2. `requiredImplementation` is set: only the Ready plugins serving the
//!    API whose implementation matches it case-insensitively, and no
//!    fallback (reason `RequiredImplementation`).
//! 3. Among Ready plugins serving the API, those whose implementation
//!    matches `preferredImplementation` case-insensitively (reason
//!    `PreferredImplementation`).
//! 4. Otherwise all Ready plugins serving the API (reason `Fallback`).
//!
//! Within a set, the highest version wins, then the smallest name.

use std::cmp::Ordering;
use std::sync::Arc;

use super::Registry;
use crate::v1alpha1::{ApiSelector, Plugin, Selection, SelectionReason};

/// Why no plugin could be chosen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    #[error("plugin {0:?} not found")]
    NotFound(String),
    #[error("plugin {name:?} is not Ready: {why}")]
    NotReady { name: String, why: String },
    #[error("plugin {name:?} serves {serves}, not {asked}")]
    WrongApi {
        name: String,
        serves: String,
        asked: String,
    },
    #[error("no Ready plugin serves {0}")]
    NoneReady(String),
    #[error("no Ready plugin of implementation {implementation} serves {api}")]
    NoneReadyOfImplementation { api: String, implementation: String },
}

/// What a request asks of the chosen plugin's implementation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Implementation<'a> {
    /// Any implementation of the API.
    #[default]
    Any,
    /// This one if it has a Ready plugin, else any.
    Preferred(&'a str),
    /// This one or none.
    Required(&'a str),
}

impl<'a> Implementation<'a> {
    /// From a Reconcile's fields: a required implementation outranks a
    /// preferred one; empty strings ask for nothing.
    pub fn from_spec(required: Option<&'a str>, preferred: Option<&'a str>) -> Self {
        let given = |name: Option<&'a str>| name.filter(|n| !n.is_empty());
        match (given(required), given(preferred)) {
            (Some(required), _) => Self::Required(required),
            (None, Some(preferred)) => Self::Preferred(preferred),
            (None, None) => Self::Any,
        }
    }
}

/// Orders versions the way semantic versioning does, tolerating free-form
/// ones: dot-separated parts compare numerically when both are numbers
/// ("1.10.0" > "1.9.2"), a pre-release sorts before its release
/// ("1.0.0-rc.1" < "1.0.0"), build metadata is ignored, and a leading "v"
/// is dropped.
pub fn compare_versions(a: &str, b: &str) -> Ordering {
    fn parts(text: &str) -> Vec<&str> {
        text.split('.').collect()
    }
    fn compare_parts(a: &[&str], b: &[&str]) -> Ordering {
        for (x, y) in a.iter().zip(b) {
            let order = match (x.parse::<u64>(), y.parse::<u64>()) {
                (Ok(x), Ok(y)) => x.cmp(&y),
                _ => x.cmp(y),
            };
            if order != Ordering::Equal {
                return order;
            }
        }
        a.len().cmp(&b.len())
    }
    let normalize = |v: &str| -> (String, Option<String>) {
        let v = v.trim_start_matches('v');
        let v = v.split_once('+').map_or(v, |(core, _)| core);
        match v.split_once('-') {
            Some((core, pre)) => (core.to_owned(), Some(pre.to_owned())),
            None => (v.to_owned(), None),
        }
    };
    let ((core_a, pre_a), (core_b, pre_b)) = (normalize(a), normalize(b));
    compare_parts(&parts(&core_a), &parts(&core_b)).then_with(|| match (pre_a, pre_b) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Greater,
        (Some(_), None) => Ordering::Less,
        (Some(x), Some(y)) => compare_parts(&parts(&x), &parts(&y)),
    })
}

/// Highest version first, then smallest name.
fn best(candidates: impl Iterator<Item = Arc<Plugin>>) -> Option<Arc<Plugin>> {
    candidates.min_by(|a, b| {
        compare_versions(&b.spec.version, &a.spec.version).then_with(|| a.name().cmp(b.name()))
    })
}

fn not_ready_reason(plugin: &Plugin) -> String {
    plugin
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == crate::v1alpha1::CONDITION_READY)
        .map_or_else(|| "no Ready condition".to_owned(), |c| c.message.clone())
}

impl Registry {
    /// The plugin a request should go to, and why.
    pub fn select(
        &self,
        api: Option<&ApiSelector>,
        implementation: Implementation<'_>,
        pinned: Option<&str>,
    ) -> Result<(Arc<Plugin>, Selection), SelectError> {
        if let Some(name) = pinned {
            let plugin = self
                .get(name)
                .ok_or_else(|| SelectError::NotFound(name.to_owned()))?;
            if let Some(api) = api
                && !api.matches(&plugin.spec.api)
            {
                return Err(SelectError::WrongApi {
                    name: name.to_owned(),
                    serves: plugin.spec.api.qualified_resource(),
                    asked: api.qualified_resource(),
                });
            }
            if !plugin.is_ready() {
                return Err(SelectError::NotReady {
                    name: name.to_owned(),
                    why: not_ready_reason(&plugin),
                });
            }
            let selection = Selection {
                reason: SelectionReason::Requested,
                message: format!("plugin {name} was requested by name"),
            };
            return Ok((plugin, selection));
        }
        let Some(api) = api else {
            return Err(SelectError::NoneReady("an unspecified API".to_owned()));
        };
        let ready: Vec<Arc<Plugin>> = self
            .list(None, |p| p.is_ready() && api.matches(&p.spec.api))
            .items
            .into_iter()
            .map(|item| item.object)
            .collect();
        let of = |implementation: &str| {
            ready
                .iter()
                .filter(|p| p.spec.implementation.eq_ignore_ascii_case(implementation))
                .cloned()
                .collect::<Vec<_>>()
        };
        let preference = match implementation {
            Implementation::Required(required) => {
                let plugin = best(of(required).into_iter()).ok_or_else(|| {
                    SelectError::NoneReadyOfImplementation {
                        api: api.qualified_resource(),
                        implementation: required.to_owned(),
                    }
                })?;
                let selection = Selection {
                    reason: SelectionReason::RequiredImplementation,
                    message: format!(
                        "{} is the required implementation and has a Ready plugin",
                        plugin.spec.implementation
                    ),
                };
                return Ok((plugin, selection));
            }
            Implementation::Preferred(preferred) => {
                if let Some(plugin) = best(of(preferred).into_iter()) {
                    let selection = Selection {
                        reason: SelectionReason::PreferredImplementation,
                        message: format!(
                            "{} is the preferred implementation and has a Ready plugin",
                            plugin.spec.implementation
                        ),
                    };
                    return Ok((plugin, selection));
                }
                format!("no Ready plugin implements {preferred}; ")
            }
            Implementation::Any => String::new(),
        };
        let plugin = best(ready.into_iter())
            .ok_or_else(|| SelectError::NoneReady(api.qualified_resource()))?;
        let selection = Selection {
            reason: SelectionReason::Fallback,
            message: format!(
                "{preference}chose {} ({}) by highest version, then name",
                plugin.name(),
                plugin.spec.implementation
            ),
        };
        Ok((plugin, selection))
    }
}

#[cfg(test)]
mod tests {
    use std::cmp::Ordering;

    use super::compare_versions;

    #[test]
    fn versions_compare_numerically() {
        assert_eq!(compare_versions("1.10.0", "1.9.2"), Ordering::Greater);
        assert_eq!(compare_versions("v2", "1.99"), Ordering::Greater);
        assert_eq!(compare_versions("1.0", "1.0.0"), Ordering::Less);
        assert_eq!(compare_versions("1.0.0", "1.0.0"), Ordering::Equal);
        assert_eq!(
            compare_versions("1.0.0-beta", "1.0.0-alpha"),
            Ordering::Greater
        );
        assert_eq!(compare_versions("1.0.0-rc.1", "1.0.0"), Ordering::Less);
        assert_eq!(
            compare_versions("1.0.0-rc.10", "1.0.0-rc.9"),
            Ordering::Greater
        );
        assert_eq!(compare_versions("1.0.0+build.5", "1.0.0"), Ordering::Equal);
    }
}
