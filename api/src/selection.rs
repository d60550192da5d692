//! Which live plugin serves a request, and why: the rule itself, without
//! IO, so that kplug's registry and its clients (`kubectl kplug plugins`)
//! decide the same way from the same Plugin objects.
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
//!
//! A version constraint (see [`crate::version`]) narrows every rule to the
//! plugins with a Ready instance whose version is in range, and a plugin's
//! version within its set to the newest such instance's.
//!
//! Rules 2 to 4 take any [`Candidate`]: a client its decoded Plugins, the
//! registry its live records, which it does not keep as typed objects.
//! Rule 1 takes anything that borrows a [`Plugin`], for its Ready
//! condition's message.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::sync::Arc;

use crate::v1alpha1::{
    ApiSelector, CONDITION_READY, Plugin, PluginApi, Selection, SelectionReason,
};
use crate::version::VersionConstraint;

/// What the rule reads of a plugin.
pub trait Candidate {
    fn name(&self) -> &str;
    /// The plugin's Ready condition is True.
    fn is_ready(&self) -> bool;
    fn api(&self) -> &PluginApi;
    fn implementation(&self) -> &str;
    fn version(&self) -> &str;
    /// The versions of the instances that take calls: during a rolling
    /// update, more than one.
    fn ready_versions(&self) -> Vec<&str>;
}

impl Candidate for Plugin {
    fn name(&self) -> &str {
        Plugin::name(self)
    }

    fn is_ready(&self) -> bool {
        Plugin::is_ready(self)
    }

    fn api(&self) -> &PluginApi {
        &self.spec.api
    }

    fn implementation(&self) -> &str {
        &self.spec.implementation
    }

    fn version(&self) -> &str {
        &self.spec.version
    }

    fn ready_versions(&self) -> Vec<&str> {
        if self.status.instances.is_empty() {
            return vec![&self.spec.version];
        }
        self.status
            .serving_instances()
            .map(|i| i.version.as_str())
            .collect()
    }
}

/// Forwards to the candidate behind a reference or an `Arc`.
macro_rules! forward_candidate {
    ($($wrapper:ty),*) => {$(
        impl<T: Candidate + ?Sized> Candidate for $wrapper {
            fn name(&self) -> &str {
                (**self).name()
            }

            fn is_ready(&self) -> bool {
                (**self).is_ready()
            }

            fn api(&self) -> &PluginApi {
                (**self).api()
            }

            fn implementation(&self) -> &str {
                (**self).implementation()
            }

            fn version(&self) -> &str {
                (**self).version()
            }

            fn ready_versions(&self) -> Vec<&str> {
                (**self).ready_versions()
            }
        }
    )*};
}

forward_candidate!(&T, Arc<T>);

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
    #[error("no Ready plugin {of} has a version in {constraint} (Ready: {seen})")]
    NoVersionInRange {
        /// `of databasetables.myorg.org`, `of implementation X serving ...`,
        /// or the plugin's name.
        of: String,
        constraint: String,
        /// Each Ready version with its plugin's name.
        seen: String,
    },
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

/// The order within a set: highest version first, then smallest name.
pub fn preference_order(a: &impl Candidate, b: &impl Candidate) -> Ordering {
    compare_versions(b.version(), a.version()).then_with(|| a.name().cmp(b.name()))
}

/// The first of `candidates` in [`preference_order`].
pub fn best<P: Candidate>(candidates: impl IntoIterator<Item = P>) -> Option<P> {
    candidates.into_iter().min_by(preference_order)
}

/// Why a plugin is not Ready, from its Ready condition.
pub fn not_ready_reason(plugin: &Plugin) -> String {
    plugin
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == CONDITION_READY)
        .map_or_else(|| "no Ready condition".to_owned(), |c| c.message.clone())
}

/// Rule 1: the plugin named `name` (`found`, when it exists) must serve
/// `api` (when given), be Ready and, with a constraint, have a Ready
/// instance in range.
pub fn pinned<P: Borrow<Plugin>>(
    name: &str,
    found: Option<P>,
    api: Option<&ApiSelector>,
    versions: Option<&VersionConstraint>,
) -> Result<(P, Selection), SelectError> {
    let plugin = found.ok_or_else(|| SelectError::NotFound(name.to_owned()))?;
    let spec = &plugin.borrow().spec;
    if let Some(api) = api
        && !api.matches(&spec.api)
    {
        return Err(SelectError::WrongApi {
            name: name.to_owned(),
            serves: spec.api.qualified_resource(),
            asked: api.qualified_resource(),
        });
    }
    if !plugin.borrow().is_ready() {
        return Err(SelectError::NotReady {
            name: name.to_owned(),
            why: not_ready_reason(plugin.borrow()),
        });
    }
    let mut message = format!("plugin {name} was requested by name");
    if let Some(versions) = versions {
        let newest = newest_in_range(plugin.borrow(), versions).ok_or_else(|| {
            SelectError::NoVersionInRange {
                of: format!("named {name}"),
                constraint: versions.to_string(),
                seen: seen(&[plugin.borrow()]),
            }
        })?;
        message.push_str(&in_range_note(&newest, versions));
    }
    let selection = Selection {
        reason: SelectionReason::Requested,
        message,
    };
    Ok((plugin, selection))
}

/// The newest of `plugin`'s Ready versions in `versions`.
fn newest_in_range(plugin: &impl Candidate, versions: &VersionConstraint) -> Option<String> {
    plugin
        .ready_versions()
        .into_iter()
        .filter(|v| versions.matches(v))
        .max_by(|a, b| compare_versions(a, b))
        .map(str::to_owned)
}

fn in_range_note(version: &str, versions: &VersionConstraint) -> String {
    format!("; {version} is its newest Ready version in {versions}")
}

/// The Ready versions of `plugins`, each with its plugin's name.
fn seen<P: Candidate>(plugins: &[P]) -> String {
    let mut seen: Vec<String> = plugins
        .iter()
        .flat_map(|p| {
            let name = p.name();
            p.ready_versions()
                .into_iter()
                .map(move |v| format!("{v} ({name})"))
        })
        .collect();
    seen.sort();
    seen.dedup();
    seen.join(", ")
}

/// A candidate ranked by its newest Ready version in range.
struct InRange<P> {
    plugin: P,
    version: String,
}

impl<P: Candidate> Candidate for InRange<P> {
    fn name(&self) -> &str {
        self.plugin.name()
    }

    fn is_ready(&self) -> bool {
        self.plugin.is_ready()
    }

    fn api(&self) -> &PluginApi {
        self.plugin.api()
    }

    fn implementation(&self) -> &str {
        self.plugin.implementation()
    }

    fn version(&self) -> &str {
        &self.version
    }

    fn ready_versions(&self) -> Vec<&str> {
        vec![&self.version]
    }
}

/// Rules 2 to 4 among `plugins`: only the Ready ones serving `api` (and,
/// with a constraint, with a Ready version in range) count, so the caller
/// may pass every plugin it knows.
pub fn choose<P: Candidate>(
    plugins: impl IntoIterator<Item = P>,
    api: &ApiSelector,
    implementation: Implementation<'_>,
    versions: Option<&VersionConstraint>,
) -> Result<(P, Selection), SelectError> {
    let ready = plugins
        .into_iter()
        .filter(|p| p.is_ready() && api.matches(p.api()));
    let Some(versions) = versions else {
        return by_implementation(ready.collect(), api, implementation);
    };
    // With a required implementation, the versions seen are its own.
    let (ready, of): (Vec<P>, String) = match implementation {
        Implementation::Required(required) => (
            ready.filter(|p| implements(p, required)).collect(),
            format!(
                "of implementation {required} serving {}",
                api.qualified_resource()
            ),
        ),
        _ => (ready.collect(), format!("of {}", api.qualified_resource())),
    };
    if ready.is_empty() {
        return by_implementation(ready, api, implementation);
    }
    let mut out_of_range = Vec::new();
    let mut in_range = Vec::new();
    for plugin in ready {
        match newest_in_range(&plugin, versions) {
            Some(version) => in_range.push(InRange { plugin, version }),
            None => out_of_range.push(plugin),
        }
    }
    if in_range.is_empty() {
        return Err(SelectError::NoVersionInRange {
            of,
            constraint: versions.to_string(),
            seen: seen(&out_of_range),
        });
    }
    let (chosen, mut selection) = by_implementation(in_range, api, implementation)?;
    selection
        .message
        .push_str(&in_range_note(&chosen.version, versions));
    Ok((chosen.plugin, selection))
}

fn implements(plugin: &impl Candidate, name: &str) -> bool {
    plugin.implementation().eq_ignore_ascii_case(name)
}

/// Rules 2 to 4 among `ready`, the Ready plugins serving `api`.
fn by_implementation<P: Candidate>(
    mut ready: Vec<P>,
    api: &ApiSelector,
    implementation: Implementation<'_>,
) -> Result<(P, Selection), SelectError> {
    let preference =
        match implementation {
            Implementation::Required(required) => {
                let plugin = best(ready.into_iter().filter(|p| implements(p, required)))
                    .ok_or_else(|| SelectError::NoneReadyOfImplementation {
                        api: api.qualified_resource(),
                        implementation: required.to_owned(),
                    })?;
                let selection = Selection {
                    reason: SelectionReason::RequiredImplementation,
                    message: format!(
                        "{} is the required implementation and has a Ready plugin",
                        plugin.implementation()
                    ),
                };
                return Ok((plugin, selection));
            }
            Implementation::Preferred(preferred) => {
                let (of_preferred, others): (Vec<P>, Vec<P>) =
                    ready.into_iter().partition(|p| implements(p, preferred));
                if let Some(plugin) = best(of_preferred) {
                    let selection = Selection {
                        reason: SelectionReason::PreferredImplementation,
                        message: format!(
                            "{} is the preferred implementation and has a Ready plugin",
                            plugin.implementation()
                        ),
                    };
                    return Ok((plugin, selection));
                }
                // None of the preferred implementation: the others are all the Ready ones.
                ready = others;
                format!("no Ready plugin implements {preferred}; ")
            }
            Implementation::Any => String::new(),
        };
    let plugin = best(ready).ok_or_else(|| SelectError::NoneReady(api.qualified_resource()))?;
    let selection = Selection {
        reason: SelectionReason::Fallback,
        message: format!(
            "{preference}chose {} ({}) by highest version, then name",
            plugin.name(),
            plugin.implementation()
        ),
    };
    Ok((plugin, selection))
}

/// The whole rule over a list of plugins: what a client holding `kubectl
/// get plugins` computes for a request with these fields.
pub fn select<P: Borrow<Plugin> + Candidate>(
    plugins: impl IntoIterator<Item = P>,
    api: Option<&ApiSelector>,
    implementation: Implementation<'_>,
    pinned_name: Option<&str>,
    versions: Option<&VersionConstraint>,
) -> Result<(P, Selection), SelectError> {
    if let Some(name) = pinned_name {
        let found = plugins.into_iter().find(|p| Candidate::name(p) == name);
        return pinned(name, found, api, versions);
    }
    let api = api.ok_or_else(|| SelectError::NoneReady("an unspecified API".to_owned()))?;
    choose(plugins, api, implementation, versions)
}

#[cfg(test)]
mod tests;
