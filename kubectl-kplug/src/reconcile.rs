//! `kubectl kplug reconcile`: read the object and its extensions with the
//! user's rights, send them through kplug's `reconciles` resource exactly
//! as kplug-operator builds the request, and report the plugin's answer.
//! Nothing is written back: that is the operator's job.

use std::io::Write;

use http::{Method, Request, header};
use kplug_api::reference::FieldPath;
use kplug_api::v1alpha1::{ApiSelector, Operation, Reconcile, ReconcileStatus, StoredObjectRef};
use kplug_operator::binding::{bound_implementation, bound_major_version, version_constraint};
use kplug_operator::delegate::{Delegation, reconciles_path, request_body};
use kplug_operator::extensions::{Resolver, parse_references};
use kube::api::{Api, DynamicObject};
use kube::{Client, ResourceExt};
use serde_json::Value;

use crate::children;
use crate::cli::{DryRun, Format, ReconcileArgs};
use crate::connect::{Asked, send_to_kplug};
use crate::error::Error;
use crate::output::{self, Subject};
use crate::resource::{self, Resolved, Target};

const RECONCILES: &str = "reconciles.plugins.kplug.io";

/// The object, read with the user's credentials.
async fn read_object(
    client: &Client,
    found: &Resolved,
    namespace: Option<&str>,
    name: &str,
) -> Result<DynamicObject, Error> {
    let api: Api<DynamicObject> = match namespace {
        Some(namespace) => Api::namespaced_with(client.clone(), namespace, &found.resource),
        None => Api::all_with(client.clone(), &found.resource),
    };
    let qualified = found.qualified();
    match api.get_opt(name).await {
        Ok(Some(object)) => Ok(object),
        Ok(None) => Err(Error::NotFound {
            resource: qualified,
            name: name.to_owned(),
            namespace: namespace.map(str::to_owned),
        }),
        Err(error) => Err(Error::from_kube(error, "get", &qualified, namespace)),
    }
}

/// The string at `path` in the object, when it is a non-empty string.
fn string_at<'a>(object: &'a DynamicObject, path: &FieldPath) -> Option<&'a str> {
    path.get(&object.data)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

/// The reference kplug reads `object` by, and its extensions at `path`.
fn reference(object: &DynamicObject, path: &FieldPath) -> StoredObjectRef {
    let types = object.types.clone().unwrap_or_default();
    let extensions_path = if *path == FieldPath::default_extensions() {
        String::new()
    } else {
        path.to_string()
    };
    StoredObjectRef {
        api_version: types.api_version,
        kind: types.kind,
        resource: String::new(),
        namespace: object.metadata.namespace.clone().unwrap_or_default(),
        name: object.name_any(),
        extensions_path,
    }
}

/// Sends the Reconcile of `object` where the operator would (in the
/// object's namespace); returns kplug's answer as sent (for `-o`) and typed.
async fn send(
    client: &Client,
    object: &DynamicObject,
    body: &Reconcile,
    api: &str,
) -> Result<(Value, ReconcileStatus), Error> {
    let bytes = serde_json::to_vec(body).map_err(|e| Error::Output(e.to_string()))?;
    let path = reconciles_path(object);
    // ?dryRun=All is what kubectl --dry-run=server sends; kplug also reads
    // spec.dryRun, which the body carries, so either alone would do.
    let uri = if body.spec.dry_run {
        format!("{path}?dryRun=All")
    } else {
        path
    };
    let request = Request::builder()
        .method(Method::POST)
        .uri(uri)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json")
        .body(bytes.into())
        .map_err(|e| Error::Transport(e.to_string()))?;
    let asked = Asked {
        verb: "create",
        resource: RECONCILES,
        namespace: object.metadata.namespace.as_deref(),
        api,
    };
    let answer = send_to_kplug(client, request, asked).await?;
    let decode =
        |e: serde_json::Error| Error::Transport(format!("kplug's answer is not a Reconcile: {e}"));
    let raw: Value = serde_json::from_slice(&answer).map_err(decode)?;
    let typed: Reconcile = serde_json::from_value(raw.clone()).map_err(decode)?;
    let outcome = typed
        .status
        .ok_or_else(|| Error::Transport("kplug's answer has no status".to_owned()))?;
    Ok((raw, outcome))
}

/// `-o yaml|json` of any value.
fn print_as(format: Format, value: &Value) -> Result<String, Error> {
    match format {
        Format::Yaml => output::yaml(value),
        Format::Json => output::json(value),
    }
}

fn print(text: &str) -> Result<(), Error> {
    std::io::stdout()
        .write_all(text.as_bytes())
        .map_err(|e| Error::Output(e.to_string()))
}

/// Runs `kubectl kplug reconcile`.
pub async fn run(
    client: &Client,
    namespace: &str,
    target: &Target,
    args: &ReconcileArgs,
) -> Result<(), Error> {
    let found = resource::resolve(client, &target.type_).await?;
    let namespace = found.namespaced.then_some(namespace);
    let object = read_object(client, &found, namespace, &target.name).await?;

    // The operator's defaults, so that the same object sends the same
    // request; by reference, kplug reads the extensions itself.
    let path = &args.extensions_path;
    let extensions = if args.by_reference {
        Vec::new()
    } else {
        let references = parse_references(&path.to_string(), path.get(&object.data))
            .map_err(kplug_operator::ExtensionError::from)?;
        Resolver::new(client.clone())
            .resolve(&references, namespace)
            .await?
    };
    let observed = children::observe(client, &object).await;
    let bound = bound_implementation(&object);
    let required = args.binding.required(bound, false);
    let preferred = args
        .implementation
        .clone()
        .or_else(|| string_at(&object, &args.preferred_implementation_path).map(str::to_owned));
    if let (Some(bound), Some(asked)) = (required, &args.implementation)
        && !bound.eq_ignore_ascii_case(asked)
    {
        eprintln!(
            "note: {} is bound to {bound} (status.implementation): only {bound} plugins may serve it, so --implementation {asked} does not apply; --binding FollowSelection lets kplug choose",
            target.name
        );
    }
    let api = ApiSelector {
        group: found.resource.group.clone(),
        resource: found.resource.plural.clone(),
        version: String::new(),
    };
    let mut body = request_body(&Delegation {
        operation: Operation::Reconcile,
        api: &api,
        object: &object,
        extensions: &extensions,
        // As the operator: a required implementation makes a preference moot.
        preferred_implementation: preferred.filter(|_| required.is_none()),
        required_implementation: required.map(str::to_owned),
        version_constraint: version_constraint(
            string_at(&object, &args.version_constraint_path),
            args.version_constraint.as_deref(),
            required.and(bound_major_version(&object)),
        ),
        timeout: args.timeout,
        traceparent: None,
        observed_children: &observed,
        child_scope: args.child_scope,
    })
    .map_err(|e| Error::Output(e.to_string()))?;
    body.spec.dry_run = args.dry_run == DryRun::Server;
    body.spec.plugin = args.plugin.clone();
    if args.by_reference {
        body.spec.object = None;
        body.spec.object_ref = Some(reference(&object, path));
    }

    if args.dry_run == DryRun::Client {
        let request = serde_json::to_value(&body).map_err(|e| Error::Output(e.to_string()))?;
        return print(&print_as(args.output.unwrap_or(Format::Yaml), &request)?);
    }
    let (raw, outcome) = send(client, &object, &body, &api.qualified_resource()).await?;
    match args.output {
        Some(format) => print(&print_as(format, &raw)?)?,
        None => {
            let singular = found.resource.kind.to_lowercase();
            let object_name = if found.resource.group.is_empty() {
                format!("{singular}/{}", target.name)
            } else {
                format!("{singular}.{}/{}", found.resource.group, target.name)
            };
            let subject = Subject {
                object: &object_name,
                namespace,
                dry_run: body.spec.dry_run,
            };
            print(&output::outcome(&subject, &outcome))?;
            if body.spec.dry_run {
                let plans = children::plan(client, &object, &outcome.desired_children).await;
                print(&children::describe(&plans))?;
            }
        }
    }
    if outcome.success {
        Ok(())
    } else {
        Err(Error::PluginFailed(output::failure_summary(
            &outcome.results,
        )))
    }
}
