//! `kubectl kplug render`: a plugin's answer for objects in files, with no
//! cluster and no kplug. The objects are read and checked (`input`), the
//! plugin command is started in the SDKs' local mode (`process`) or a
//! running plugin is dialed, called once over plain gRPC as kplug calls it
//! (with the observed children of `--observed`), and its answer is read as
//! kplug reads one (`kplug_api::answer`), desired children included.

mod input;
mod process;

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use kplug_api::answer::{self, PluginAnswer};
use kplug_api::children::Placement;
use kplug_proto::v1alpha1::plugin_client::PluginClient;
use kplug_proto::v1alpha1::{ObservedChild, ReconcileRequest, ReconcileResponse};
use tonic::transport::Endpoint;

use crate::cli::{Format, RenderArgs};
use crate::error::Error;
use crate::output;
use input::Objects;
use process::LocalPlugin;

/// How long dialing the plugin may take: it listens already.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs `kubectl kplug render`.
pub async fn run(args: &RenderArgs) -> Result<(), Error> {
    let usage = |e: input::InputError| Error::Usage(e.to_string());
    let objects = input::objects(&read_files(&args.files)?).map_err(usage)?;
    let observed = input::observed(&read_files(&args.observed)?).map_err(usage)?;
    let observed: Vec<ObservedChild> = (observed.into_iter())
        .map(|(key, object)| ObservedChild { key, object })
        .collect();
    let answer = match &args.plugin_address {
        Some(address) => call(address, args, &objects, &observed).await,
        None => {
            let (plugin, address) = LocalPlugin::start(&args.command, args.start_timeout)
                .await
                .map_err(|e| Error::PluginNotStarted(e.to_string()))?;
            let answer = call(&address, args, &objects, &observed).await;
            plugin.stop().await;
            answer
        }
    }?;
    // Extension statuses are checked against the extensions sent, and
    // children against the object's namespace, as kplug does.
    let object: serde_json::Value = serde_json::from_slice(&objects.object).unwrap_or_default();
    let placement = Placement {
        namespace: object["metadata"]["namespace"].as_str().unwrap_or_default(),
        scope: args.child_scope.into(),
    };
    let sent = objects.extensions.iter().map(Vec::as_slice);
    let rendered = answer::checked(answer, sent, placement).map_err(|error| {
        Error::PluginAnswer(format!("kplug would refuse the plugin's answer: {error}"))
    })?;
    print(args.output, &rendered)?;
    if rendered.success {
        Ok(())
    } else {
        Err(Error::PluginFailed(output::failure_summary(
            &rendered.results,
        )))
    }
}

/// Each file's name and text; `-` is stdin.
fn read_files(paths: &[PathBuf]) -> Result<Vec<(String, String)>, Error> {
    paths
        .iter()
        .map(|path| {
            let name = path.display().to_string();
            let text = if name == "-" {
                let mut text = String::new();
                std::io::stdin().read_to_string(&mut text).map(|_| text)
            } else {
                std::fs::read_to_string(path)
            };
            text.map(|text| (name.clone(), text))
                .map_err(|e| Error::Usage(format!("cannot read {name}: {e}")))
        })
        .collect()
}

/// Calls the plugin at `address` once, as kplug would.
async fn call(
    address: &str,
    args: &RenderArgs,
    objects: &Objects,
    observed: &[ObservedChild],
) -> Result<ReconcileResponse, Error> {
    let unreachable = |reason: String| {
        Error::PluginAnswer(format!("cannot call the plugin at {address}: {reason}"))
    };
    let endpoint = Endpoint::from_shared(format!("http://{address}"))
        .map_err(|e| unreachable(e.to_string()))?
        .connect_timeout(CONNECT_TIMEOUT);
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| unreachable(error_chain(&e)))?;
    let mut client = PluginClient::new(channel);
    let mut request = tonic::Request::new(ReconcileRequest {
        operation_id: uuid::Uuid::new_v4().to_string(),
        dry_run: args.dry_run,
        object: objects.object.clone().into(),
        extensions: objects.extensions.iter().cloned().map(Into::into).collect(),
        timeout: prost_types::Duration::try_from(args.timeout).ok(),
        // Rendered on this machine: no kplug authenticated anyone.
        caller: None,
        observed_children: observed.to_vec(),
    });
    request.set_timeout(args.timeout);
    let operation = if args.finalize {
        "Finalize"
    } else {
        "Reconcile"
    };
    let timed_out = || {
        Error::PluginAnswer(format!(
            "the plugin did not answer {operation} within {:?} (--timeout)",
            args.timeout
        ))
    };
    let answered = tokio::time::timeout(args.timeout, async {
        if args.finalize {
            client.finalize(request).await
        } else {
            client.reconcile(request).await
        }
    })
    .await
    .map_err(|_| timed_out())?;
    answered.map(tonic::Response::into_inner).map_err(|status| {
        // tonic's own timer for the grpc-timeout sent can fire first.
        if sources(&status).any(|e| e.is::<tonic::TimeoutExpired>()) {
            return timed_out();
        }
        Error::PluginAnswer(format!(
            "the plugin answered {operation} with gRPC {:?}: {}",
            status.code(),
            status.message()
        ))
    })
}

/// The answer in the order of its fields, as `-o` gives it.
fn print(format: Format, answer: &PluginAnswer) -> Result<(), Error> {
    let text = match format {
        Format::Yaml => output::yaml(answer)?,
        Format::Json => output::json(answer)?,
    };
    std::io::stdout()
        .write_all(text.as_bytes())
        .map_err(|e| Error::Output(e.to_string()))
}

/// `error`'s causes, nearest first.
fn sources<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(error.source(), |cause| cause.source())
}

/// `error: cause: cause…`: tonic keeps the detail in its sources, some of
/// which repeat their own cause's words.
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    sources(error).fold(error.to_string(), |text, cause| {
        let words = cause.to_string();
        match text.ends_with(&words) {
            true => text,
            false => format!("{text}: {words}"),
        }
    })
}
