//! The generated gRPC service: each call decoded, given its deadline and
//! trace context, run as its own task and answered.

use std::sync::Arc;
use std::time::Duration;

use kplug_proto::trace::{TRACEPARENT, TraceParent};
use kplug_proto::v1alpha1 as proto;
use kplug_proto::v1alpha1::plugin_server::Plugin as PluginService;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;
use tracing::{Instrument, debug, info_span, warn};

use super::deadline::{deadline, parse_grpc_timeout, shorter};
use super::wire::{decode, encode};
use crate::Plugin;

/// When a call reached the server, before its body was read: deadlines
/// count from here, as tonic's own timer does.
#[derive(Clone, Copy, Debug)]
struct Arrival(Instant);

/// Runs before the request body is decoded.
#[allow(clippy::result_large_err)] // tonic's interceptor signature
pub(super) fn stamp_arrival(
    mut request: tonic::Request<()>,
) -> Result<tonic::Request<()>, tonic::Status> {
    request.extensions_mut().insert(Arrival(Instant::now()));
    Ok(request)
}

#[derive(Clone, Copy, Debug)]
enum Operation {
    Reconcile,
    Finalize,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Self::Reconcile => "Reconcile",
            Self::Finalize => "Finalize",
        }
    }
}

/// The generated gRPC service, calling the author's [`Plugin`].
pub(super) struct Service<P> {
    pub(super) plugin: Arc<P>,
    /// Turns true when shutdown gives up on the calls still running.
    pub(super) cancelled: watch::Receiver<bool>,
}

#[tonic::async_trait]
impl<P: Plugin> PluginService for Service<P> {
    async fn reconcile(
        &self,
        request: tonic::Request<proto::ReconcileRequest>,
    ) -> Result<tonic::Response<proto::ReconcileResponse>, tonic::Status> {
        self.call(Operation::Reconcile, request)
            .await
            .map(tonic::Response::new)
    }

    async fn finalize(
        &self,
        request: tonic::Request<proto::ReconcileRequest>,
    ) -> Result<tonic::Response<proto::ReconcileResponse>, tonic::Status> {
        self.call(Operation::Finalize, request)
            .await
            .map(tonic::Response::new)
    }
}

impl<P: Plugin> Service<P> {
    async fn call(
        &self,
        operation: Operation,
        request: tonic::Request<proto::ReconcileRequest>,
    ) -> Result<proto::ReconcileResponse, tonic::Status> {
        let arrival = request
            .extensions()
            .get::<Arrival>()
            .map_or_else(Instant::now, |arrival| arrival.0);
        let header = request
            .metadata()
            .get("grpc-timeout")
            .and_then(|value| value.to_str().ok())
            .and_then(parse_grpc_timeout);
        let trace_parent = trace_parent(request.metadata());
        let message = request.into_inner();
        let field = message
            .timeout
            .and_then(|timeout| Duration::try_from(timeout).ok());
        let timeout = shorter(header, field.filter(|t| !t.is_zero()));
        let deadline = timeout.and_then(|timeout| deadline(arrival, timeout));
        let mut request = decode(message, deadline)?;
        let ignored_trace_parent = match trace_parent {
            Ok(trace_parent) => {
                request.trace_parent = trace_parent;
                None
            }
            Err(reason) => Some(reason),
        };

        // Every line logged for the call, the plugin's own included, carries
        // the operation id and, when kplug sent one, the trace id.
        let span = info_span!(
            "call",
            operation = operation.as_str(),
            operation_id = %request.operation_id,
            trace_id = request
                .trace_parent
                .as_ref()
                .map(|trace_parent| tracing::field::display(trace_parent.trace_id())),
            object = request.name().unwrap_or_default(),
            dry_run = request.dry_run,
        );
        if let Some(reason) = ignored_trace_parent {
            debug!(parent: &span, %reason, "ignoring the traceparent metadata");
        }
        let plugin = Arc::clone(&self.plugin);
        // Its own task, so a panic unwinds that task only; dropped (on a
        // timeout or when the caller goes away), it cancels the call.
        let task = AbortOnDropHandle::new(tokio::spawn(
            async move {
                match operation {
                    Operation::Reconcile => plugin.reconcile(request).await,
                    Operation::Finalize => plugin.finalize(request).await,
                }
            }
            .instrument(span.clone()),
        ));
        let answer = async {
            match deadline {
                Some(deadline) => tokio::time::timeout_at(deadline, task).await.map_err(|_| {
                    let timeout = timeout.unwrap_or_default();
                    warn!(parent: &span, ?timeout, "deadline exceeded; cancelling the call");
                    tonic::Status::deadline_exceeded(format!(
                        "the plugin did not answer within the caller's timeout of {timeout:?}"
                    ))
                }),
                None => Ok(task.await),
            }
        };
        let mut cancelled = self.cancelled.clone();
        let joined = tokio::select! {
            answer = answer => answer?,
            _ = cancelled.wait_for(|cancelled| *cancelled) => {
                return Err(tonic::Status::unavailable(
                    "the plugin shut down before the call finished",
                ));
            }
        };
        let outcome = joined.map_err(|error| {
            if error.is_panic() {
                let message = panic_message(error.into_panic());
                warn!(parent: &span, panic = %message, "the plugin panicked");
                tonic::Status::internal(format!("plugin panicked: {message}"))
            } else {
                tonic::Status::unavailable("the plugin is shutting down")
            }
        })?;
        debug!(parent: &span, success = outcome.success, results = outcome.results.len(), "answered");
        encode(outcome)
    }
}

/// The call's `traceparent` metadata: `Ok(None)` without one, `Err` with
/// why when it is not a single valid W3C `traceparent`. Either way the call
/// goes ahead; only the trace id is missing from it.
fn trace_parent(metadata: &tonic::metadata::MetadataMap) -> Result<Option<TraceParent>, String> {
    let mut values = metadata.get_all(TRACEPARENT).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        // What a combined header would be: invalid.
        return Err("more than one traceparent".to_owned());
    }
    let text = value
        .to_str()
        .map_err(|_| "traceparent is not visible ASCII".to_owned())?;
    text.parse()
        .map(Some)
        .map_err(|error: kplug_proto::trace::TraceParentError| error.to_string())
}

/// The text a panic was raised with, when it is text.
fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(message) => *message,
        Err(payload) => payload
            .downcast_ref::<&str>()
            .map_or_else(|| "(no message)".to_owned(), |&message| message.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_metadata() {
        const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut metadata = tonic::metadata::MetadataMap::new();
        assert_eq!(trace_parent(&metadata), Ok(None));
        metadata.insert(TRACEPARENT, EXAMPLE.parse().unwrap());
        let parsed = trace_parent(&metadata).unwrap().unwrap();
        assert_eq!(parsed.to_string(), EXAMPLE);
        metadata.append(TRACEPARENT, EXAMPLE.parse().unwrap());
        assert_eq!(
            trace_parent(&metadata),
            Err("more than one traceparent".to_owned())
        );
        metadata.insert(TRACEPARENT, "00-nope".parse().unwrap());
        assert!(
            trace_parent(&metadata)
                .unwrap_err()
                .contains("lowercase hex")
        );
        metadata.insert(
            TRACEPARENT,
            tonic::metadata::MetadataValue::try_from(&b"00-\xff"[..]).unwrap(),
        );
        assert!(trace_parent(&metadata).is_err());
    }

    #[test]
    fn panic_messages() {
        assert_eq!(panic_message(Box::new("static")), "static");
        assert_eq!(panic_message(Box::new(String::from("owned"))), "owned");
        assert_eq!(panic_message(Box::new(42)), "(no message)");
    }
}
