//! TYPE and TYPE/NAME as kubectl takes them, resolved through the
//! cluster's discovery documents: a plural, singular, kind or short name,
//! optionally qualified as `plural.group` or `plural.version.group`.

use futures::future::join_all;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList;
use kube::Client;
use kube::api::ApiResource;

use crate::error::Error;

/// An object named on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub type_: String,
    pub name: String,
}

/// `TYPE/NAME`, or `TYPE` followed by `NAME`, as kubectl takes them.
pub fn parse_target(first: &str, second: Option<&str>) -> Result<Target, Error> {
    let usage = |why: &str| {
        Error::Usage(format!(
            "{why}\n  name one object as TYPE/NAME or TYPE NAME, e.g. databasetable/users"
        ))
    };
    let (type_, name) = match (first.split_once('/'), second) {
        (Some(_), Some(_)) => {
            return Err(usage(&format!(
                "there is a NAME after {first:?}, which already names one"
            )));
        }
        (Some((type_, name)), None) => (type_, name),
        (None, Some(name)) => (first, name),
        (None, None) => return Err(usage(&format!("{first:?} names no object"))),
    };
    if type_.is_empty() || name.is_empty() || name.contains('/') {
        return Err(usage(&format!("{first:?} is not TYPE/NAME")));
    }
    Ok(Target {
        type_: type_.to_owned(),
        name: name.to_owned(),
    })
}

/// One reading of TYPE: a name, and maybe a group and version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypeQuery {
    pub name: String,
    pub group: Option<String>,
    pub version: Option<String>,
}

/// A Kubernetes version string such as v1, v1beta2, v2alpha1.
fn is_version(text: &str) -> bool {
    let Some(rest) = text.strip_prefix('v') else {
        return false;
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return false;
    }
    let tail = &rest[digits..];
    ["alpha", "beta"].iter().any(|level| {
        tail.strip_prefix(level)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    }) || tail.is_empty()
}

/// The readings of TYPE in kubectl's order: `name.version.group` when the
/// second part is a version, then `name.group`, or the bare name.
pub fn interpretations(type_: &str) -> Vec<TypeQuery> {
    let Some((name, rest)) = type_.split_once('.') else {
        return vec![TypeQuery {
            name: type_.to_owned(),
            group: None,
            version: None,
        }];
    };
    let mut readings = Vec::new();
    if let Some((version, group)) = rest.split_once('.')
        && is_version(version)
    {
        readings.push(TypeQuery {
            name: name.to_owned(),
            group: Some(group.to_owned()),
            version: Some(version.to_owned()),
        });
    }
    readings.push(TypeQuery {
        name: name.to_owned(),
        group: Some(rest.to_owned()),
        version: None,
    });
    readings
}

/// A resource from discovery.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Candidate {
    pub group: String,
    pub version: String,
    /// The group's preferred version.
    pub preferred: bool,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub short_names: Vec<String>,
    pub namespaced: bool,
}

impl Candidate {
    fn answers_to(&self, name: &str) -> bool {
        let lower = name.to_lowercase();
        self.plural == lower
            || self.singular == lower
            || self.short_names.contains(&lower)
            || self.kind.eq_ignore_ascii_case(name)
    }
}

/// The resource TYPE names among `candidates` (in discovery order, which
/// is the server's group priority): the first group that has it, at the
/// version asked for, else the group's preferred version, else the first
/// version that serves it.
pub fn pick<'a>(query: &TypeQuery, candidates: &'a [Candidate]) -> Option<&'a Candidate> {
    let matching: Vec<&Candidate> = candidates
        .iter()
        .filter(|c| c.answers_to(&query.name))
        .filter(|c| query.group.as_ref().is_none_or(|g| *g == c.group))
        .filter(|c| query.version.as_ref().is_none_or(|v| *v == c.version))
        .collect();
    let group = &matching.first()?.group;
    let of_group = || matching.iter().copied().filter(|c| c.group == *group);
    of_group()
        .find(|c| c.preferred)
        .or_else(|| of_group().next())
}

/// A resolved TYPE.
#[derive(Clone, Debug)]
pub struct Resolved {
    pub resource: ApiResource,
    pub namespaced: bool,
}

impl Resolved {
    /// `plural.group` (just `plural` for the core group), as kubectl prints it.
    pub fn qualified(&self) -> String {
        if self.resource.group.is_empty() {
            self.resource.plural.clone()
        } else {
            format!("{}.{}", self.resource.plural, self.resource.group)
        }
    }
}

fn candidates_of(list: APIResourceList, group: &str, preferred: bool) -> Vec<Candidate> {
    let version = list
        .group_version
        .rsplit_once('/')
        .map_or(list.group_version.as_str(), |(_, v)| v)
        .to_owned();
    list.resources
        .into_iter()
        // Subresources (plugins/reconcile, deployments/scale) are no TYPE.
        .filter(|r| !r.name.contains('/'))
        .map(|r| Candidate {
            group: group.to_owned(),
            version: version.clone(),
            preferred,
            singular: if r.singular_name.is_empty() {
                r.kind.to_lowercase()
            } else {
                r.singular_name
            },
            plural: r.name,
            kind: r.kind,
            short_names: r.short_names.unwrap_or_default(),
            namespaced: r.namespaced,
        })
        .collect()
}

/// Every resource the cluster serves (only `only_group` when given), in
/// discovery order. Group versions that fail (an aggregated API that is
/// down) are skipped, as kubectl does.
async fn discover(client: &Client, only_group: Option<&str>) -> Result<Vec<Candidate>, Error> {
    let discovery_error = |e: kube::Error| Error::from_kube(e, "discover", "the API", None);
    let mut lists = Vec::new();
    if only_group.is_none_or(str::is_empty) {
        let core = client
            .list_core_api_versions()
            .await
            .map_err(discovery_error)?;
        for (index, version) in core.versions.iter().enumerate() {
            lists.push((String::new(), version.clone(), index == 0));
        }
    }
    if only_group != Some("") {
        let groups = client.list_api_groups().await.map_err(discovery_error)?;
        for group in groups.groups {
            if only_group.is_some_and(|g| g != group.name) {
                continue;
            }
            let preferred = group.preferred_version.map(|p| p.version);
            for version in group.versions {
                let is_preferred = preferred.as_deref() == Some(version.version.as_str());
                lists.push((group.name.clone(), version.group_version, is_preferred));
            }
        }
    }
    let fetched = join_all(lists.iter().map(|(group, group_version, _)| async move {
        if group.is_empty() {
            client.list_core_api_resources(group_version).await
        } else {
            client.list_api_group_resources(group_version).await
        }
    }))
    .await;
    Ok(lists
        .into_iter()
        .zip(fetched)
        .filter_map(|((group, _, preferred), list)| {
            list.ok().map(|l| candidates_of(l, &group, preferred))
        })
        .flatten()
        .collect())
}

/// Resolves TYPE through discovery.
pub async fn resolve(client: &Client, type_: &str) -> Result<Resolved, Error> {
    let readings = interpretations(type_);
    // A qualified TYPE needs only its group's documents.
    let only_group = match readings.as_slice() {
        [one] => one.group.clone(),
        _ => None,
    };
    let candidates = discover(client, only_group.as_deref()).await?;
    let found = readings
        .iter()
        .find_map(|query| pick(query, &candidates))
        .ok_or_else(|| Error::UnknownType(type_.to_owned()))?;
    let api_version = if found.group.is_empty() {
        found.version.clone()
    } else {
        format!("{}/{}", found.group, found.version)
    };
    Ok(Resolved {
        resource: ApiResource {
            group: found.group.clone(),
            version: found.version.clone(),
            api_version,
            kind: found.kind.clone(),
            plural: found.plural.clone(),
        },
        namespaced: found.namespaced,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_as_kubectl_takes_them() {
        let users = Target {
            type_: "databasetable".into(),
            name: "users".into(),
        };
        assert_eq!(
            parse_target("databasetable/users", None).ok(),
            Some(users.clone())
        );
        assert_eq!(
            parse_target("databasetable", Some("users")).ok(),
            Some(users)
        );
        for (first, second) in [
            ("databasetable", None),
            ("databasetable/users", Some("more")),
            ("/users", None),
            ("databasetable/", None),
            ("a/b/c", None),
        ] {
            let error = parse_target(first, second)
                .expect_err("refused")
                .to_string();
            assert!(error.contains("TYPE/NAME"), "{first} {second:?}: {error}");
        }
    }

    #[test]
    fn qualified_types_read_version_and_group() {
        assert_eq!(
            interpretations("databasetables.v1alpha1.myorg.org"),
            vec![
                TypeQuery {
                    name: "databasetables".into(),
                    group: Some("myorg.org".into()),
                    version: Some("v1alpha1".into())
                },
                TypeQuery {
                    name: "databasetables".into(),
                    group: Some("v1alpha1.myorg.org".into()),
                    version: None
                },
            ]
        );
        assert_eq!(interpretations("databasetables.myorg.org").len(), 1);
        assert_eq!(interpretations("dt")[0].group, None);
        assert!(is_version("v1") && is_version("v2beta3") && is_version("v1alpha1"));
        assert!(!is_version("myorg") && !is_version("v") && !is_version("v1gamma1"));
    }

    fn candidate(
        group: &str,
        version: &str,
        preferred: bool,
        plural: &str,
        kind: &str,
    ) -> Candidate {
        Candidate {
            group: group.into(),
            version: version.into(),
            preferred,
            plural: plural.into(),
            singular: kind.to_lowercase(),
            kind: kind.into(),
            short_names: vec![],
            namespaced: true,
        }
    }

    #[test]
    fn names_resolve_like_kubectl() {
        let mut tables = candidate(
            "myorg.org",
            "v1alpha1",
            true,
            "databasetables",
            "DatabaseTable",
        );
        tables.short_names = vec!["dbt".into()];
        let candidates = [
            candidate("", "v1", true, "events", "Event"),
            candidate("events.k8s.io", "v1", true, "events", "Event"),
            candidate(
                "myorg.org",
                "v1beta1",
                false,
                "databasetables",
                "DatabaseTable",
            ),
            tables,
        ];
        let resolve = |type_: &str| {
            interpretations(type_)
                .iter()
                .find_map(|q| pick(q, &candidates))
                .map(|c| format!("{}/{}", c.group, c.version))
        };
        for type_ in [
            "databasetables",
            "databasetable",
            "DatabaseTable",
            "dbt",
            "databasetables.myorg.org",
            "databasetable.myorg.org",
        ] {
            assert_eq!(
                resolve(type_).as_deref(),
                Some("myorg.org/v1alpha1"),
                "{type_}"
            );
        }
        assert_eq!(
            resolve("databasetables.v1beta1.myorg.org").as_deref(),
            Some("myorg.org/v1beta1")
        );
        assert_eq!(resolve("events").as_deref(), Some("/v1"), "core first");
        assert_eq!(
            resolve("events.events.k8s.io").as_deref(),
            Some("events.k8s.io/v1")
        );
        assert_eq!(resolve("tables"), None);
        assert_eq!(resolve("databasetables.other.org"), None);
    }
}
