//! Heartbeat ingest: the gRPC `Registry` service that plugins call.

mod metrics;
mod validate;

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use kplug_proto::v1alpha1::registry_server::{Registry as RegistryApi, RegistryServer};
use kplug_proto::v1alpha1::{
    DeregisterRequest, DeregisterResponse, HeartbeatRequest, HeartbeatResponse, PROTOCOL_VERSION,
    Protocol,
};
use tonic::{Request, Response, Status};

pub use metrics::HeartbeatMetrics;
pub use validate::{FieldError, Invalid, declaration};

use crate::auth::delegated::Delegated;
use crate::auth::{Attributes, AuthError};
use crate::registry::Registry;
use crate::validation;
use metrics::Answer;

/// What the server announces it can do, so plugins can adapt.
/// "Instances": several processes may heartbeat under one plugin name,
/// each with its own `instance` and address, and deregister alone.
const SERVER_CAPABILITIES: &[&str] = &["Deregister", "Instances"];

/// Serves `kplug.v1alpha1.Registry` over the live registry.
#[derive(Clone)]
pub struct HeartbeatService {
    registry: Arc<Registry>,
    /// Cluster mode: who may heartbeat under which name. Without it
    /// (standalone mode, loopback only) callers are trusted.
    auth: Option<Arc<Delegated>>,
    metrics: HeartbeatMetrics,
}

/// A refused caller in gRPC's words; a review that could not be made is
/// `UNAVAILABLE`, so plugins retry instead of giving up.
fn grpc_status(error: AuthError) -> Status {
    match error {
        AuthError::Unauthenticated(message) => Status::unauthenticated(message),
        review @ AuthError::TokenReview(_) => Status::unauthenticated(review.to_string()),
        AuthError::Forbidden(message) => Status::permission_denied(message),
        review @ AuthError::AccessReview(_) => Status::unavailable(review.to_string()),
    }
}

/// The metric answer for a call refused with `status`.
fn rejection(status: &Status) -> Answer {
    match status.code() {
        tonic::Code::Unauthenticated => Answer::Unauthenticated,
        tonic::Code::PermissionDenied => Answer::Forbidden,
        tonic::Code::InvalidArgument => Answer::Invalid,
        _ => Answer::Unavailable,
    }
}

impl HeartbeatService {
    pub fn new(registry: Arc<Registry>, auth: Option<Arc<Delegated>>) -> Self {
        Self {
            registry,
            auth,
            metrics: HeartbeatMetrics::default(),
        }
    }

    /// Counts into `metrics` (registered by the caller).
    pub fn with_metrics(mut self, metrics: HeartbeatMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The identity allowed to heartbeat under `name`, in cluster mode.
    async fn authorize<T>(
        &self,
        request: &Request<T>,
        name: &str,
    ) -> Result<Option<String>, Status> {
        let Some(auth) = &self.auth else {
            return Ok(None);
        };
        let token = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim())
            .filter(|token| !token.is_empty())
            .ok_or_else(|| {
                Status::unauthenticated(
                    "a ServiceAccount token is required: send it as \"authorization: Bearer TOKEN\" (the SDKs' --token-file)",
                )
            })?;
        let user = auth.review_token(token).await.map_err(grpc_status)?;
        auth.authorize(&user, &Attributes::heartbeat(name))
            .await
            .map_err(grpc_status)?;
        Ok(Some(user.name))
    }

    /// The tonic service, ready to add to a server.
    pub fn into_server(self) -> RegistryServer<Self> {
        RegistryServer::new(self)
    }

    /// A refusal, asking the plugin to retry at `interval`.
    fn refusal(&self, interval: Duration, reason: &str, message: String) -> HeartbeatResponse {
        HeartbeatResponse {
            accepted: false,
            reason: reason.to_owned(),
            message,
            interval: prost_types::Duration::try_from(interval).ok(),
            ttl: prost_types::Duration::try_from(self.registry.ttl(interval)).ok(),
            uid: String::new(),
            server_protocol: Some(server_protocol()),
        }
    }
}

fn server_protocol() -> Protocol {
    Protocol {
        version: PROTOCOL_VERSION.to_owned(),
        sdk: concat!("kplug-apiserver/", env!("CARGO_PKG_VERSION")).to_owned(),
        capabilities: SERVER_CAPABILITIES
            .iter()
            .map(|c| (*c).to_owned())
            .collect(),
    }
}

impl HeartbeatService {
    /// Takes one heartbeat: the answer for the metrics, and the reply.
    async fn take(
        &self,
        request: Request<HeartbeatRequest>,
    ) -> (Answer, Result<Response<HeartbeatResponse>, Status>) {
        let registered_by = match self.authorize(&request, &request.get_ref().name).await {
            Ok(registered_by) => registered_by,
            Err(status) => {
                tracing::info!(plugin = %request.get_ref().name, reason = %status.message(), "heartbeat refused");
                return (rejection(&status), Err(status));
            }
        };
        let declaration = match declaration(request.into_inner(), &self.registry, registered_by) {
            Ok(declaration) => declaration,
            Err(Invalid::Fields(errors)) => {
                let invalid = Invalid::Fields(errors);
                tracing::debug!(error = %invalid, "heartbeat rejected");
                return (
                    Answer::Invalid,
                    Err(Status::invalid_argument(invalid.to_string())),
                );
            }
            Err(unsupported @ Invalid::UnsupportedProtocol(_)) => {
                const REASON: &str = "UnsupportedProtocol";
                let refusal = self.refusal(
                    self.registry.effective_interval(None),
                    REASON,
                    unsupported.to_string(),
                );
                return (Answer::Refused(REASON), Ok(Response::new(refusal)));
            }
        };
        let name = declaration.name.clone();
        let interval = declaration.interval;
        match self.registry.heartbeat(declaration, Timestamp::now()) {
            Ok(accepted) => (
                Answer::Accepted,
                Ok(Response::new(HeartbeatResponse {
                    accepted: true,
                    reason: String::new(),
                    message: String::new(),
                    interval: prost_types::Duration::try_from(accepted.interval).ok(),
                    ttl: prost_types::Duration::try_from(accepted.ttl).ok(),
                    uid: accepted.uid,
                    server_protocol: Some(server_protocol()),
                })),
            ),
            Err(refusal) => {
                tracing::info!(plugin = %name, reason = refusal.reason(), "heartbeat refused: {refusal}");
                let reply = self.refusal(interval, refusal.reason(), refusal.to_string());
                (Answer::Refused(refusal.reason()), Ok(Response::new(reply)))
            }
        }
    }
}

#[tonic::async_trait]
impl RegistryApi for HeartbeatService {
    async fn heartbeat(
        &self,
        request: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        let (answer, reply) = self.take(request).await;
        self.metrics.heartbeat(answer);
        reply
    }

    async fn deregister(
        &self,
        request: Request<DeregisterRequest>,
    ) -> Result<Response<DeregisterResponse>, Status> {
        self.authorize(&request, &request.get_ref().name).await?;
        let request = request.into_inner();
        if request.name.is_empty() || request.address.is_empty() {
            return Err(Status::invalid_argument(
                "invalid deregistration: name and address are required",
            ));
        }
        if !request.instance.is_empty()
            && let Some(problem) = validation::dns1123_subdomain(&request.instance)
        {
            return Err(Status::invalid_argument(format!(
                "invalid deregistration: instance: Invalid value: {:?}: {problem}",
                request.instance
            )));
        }
        let removed = self.registry.deregister(
            &request.name,
            &request.instance,
            &request.address,
            Timestamp::now(),
        );
        self.metrics.deregistration(removed);
        if removed {
            tracing::info!(
                plugin = %request.name,
                instance = %request.instance,
                address = %request.address,
                "plugin instance deregistered"
            );
        }
        Ok(Response::new(DeregisterResponse { removed }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each refusal keeps its gRPC code, its message and its metrics answer.
    #[test]
    fn auth_errors_become_grpc_statuses_and_answers() {
        let cases = [
            (
                AuthError::Unauthenticated("Unauthorized: invalid bearer token".to_owned()),
                tonic::Code::Unauthenticated,
                "Unauthorized: invalid bearer token",
                Answer::Unauthenticated,
            ),
            (
                AuthError::TokenReview(kube::Error::LinesCodecMaxLineLengthExceeded),
                tonic::Code::Unauthenticated,
                "Unauthorized: the token could not be reviewed: Error finding newline character",
                Answer::Unauthenticated,
            ),
            (
                AuthError::Forbidden("user \"x\" cannot create plugins".to_owned()),
                tonic::Code::PermissionDenied,
                "user \"x\" cannot create plugins",
                Answer::Forbidden,
            ),
            (
                AuthError::AccessReview(kube::Error::LinesCodecMaxLineLengthExceeded),
                tonic::Code::Unavailable,
                "authorization check failed: Error finding newline character",
                Answer::Unavailable,
            ),
        ];
        for (error, code, message, answer) in cases {
            let status = grpc_status(error);
            assert_eq!(status.code(), code, "{message}");
            assert_eq!(status.message(), message);
            assert_eq!(rejection(&status), answer, "{message}");
        }
        assert_eq!(rejection(&Status::invalid_argument("bad")), Answer::Invalid);
    }
}
