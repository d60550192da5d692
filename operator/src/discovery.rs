//! Finding a resource named `resource.group` (as kubectl writes it) in the
//! cluster's discovery documents.

use kube::Client;
use kube::api::ApiResource;
use kube::discovery::{self, ApiCapabilities};

use crate::Error;

/// The served resource `resource.group` (a core resource has no group),
/// at `version` or the group's preferred version; it must have a status
/// subresource, which the operator writes.
pub async fn discover(
    client: &Client,
    resource: &str,
    version: Option<&str>,
) -> Result<ApiResource, Error> {
    let (found, capabilities) = find(client, resource, version).await?;
    if !capabilities
        .subresources
        .iter()
        .any(|(sub, _)| sub.plural == "status")
    {
        return Err(Error::NoStatusSubresource(resource.to_owned()));
    }
    Ok(found)
}

async fn find(
    client: &Client,
    resource: &str,
    version: Option<&str>,
) -> Result<(ApiResource, ApiCapabilities), Error> {
    let error = |why: String| Error::Discovery {
        resource: resource.to_owned(),
        why,
    };
    let (plural, group) = resource.split_once('.').unwrap_or((resource, ""));
    let served = discovery::group(client, group)
        .await
        .map_err(|e| error(format!("the group {group:?} is not served: {e}")))?;
    let candidates = match version {
        Some(version) => served.versioned_resources(version),
        None => served.recommended_resources(),
    };
    let versions: Vec<String> = served.versions().map(str::to_owned).collect();
    candidates
        .into_iter()
        .find(|(r, _)| r.plural == plural)
        .ok_or_else(|| {
            error(format!(
                "no resource {plural:?} in {group} at {} (served versions: {})",
                version.unwrap_or("its preferred version"),
                versions.join(", ")
            ))
        })
}

/// Every resource in `resources`, each at its preferred version.
pub(crate) async fn discover_all(
    client: &Client,
    resources: &[String],
) -> Result<Vec<ApiResource>, Error> {
    let mut found = Vec::with_capacity(resources.len());
    for resource in resources {
        found.push(find(client, resource, None).await?.0);
    }
    Ok(found)
}
