//! Heartbeat ingest: the gRPC `Registry` service that plugins call.

mod denials;
mod log_budget;
mod metrics;
pub(crate) mod validate;

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::Stream;
use jiff::Timestamp;
use kplug_proto::v1alpha1::registry_server::{Registry as RegistryApi, RegistryServer};
use kplug_proto::v1alpha1::{
    DeregisterRequest, DeregisterResponse, HeartbeatRequest, HeartbeatResponse, PROTOCOL_VERSION,
    Protocol,
};
use tokio::sync::watch;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};

pub use metrics::HeartbeatMetrics;
pub use validate::{FieldError, Invalid, declaration};

use denials::Denials;
use log_budget::{LogBudget, Verdict};

use crate::auth::delegated::Delegated;
use crate::auth::{Attributes, AuthError};
use crate::identity::{SignError, Signer};
use crate::registry::Registry;
use kplug_api::validation;
use metrics::Answer;

/// What the server announces it can do, so plugins can adapt.
/// "Instances": several processes may heartbeat under one plugin name,
/// each with its own `instance` and address, and deregister alone.
/// "HeartbeatStream": the `Heartbeats` call takes them on one stream.
const SERVER_CAPABILITIES: &[&str] = &["Deregister", "Instances", "HeartbeatStream"];

/// What an accepted heartbeat's answer carries of the plugin's identity.
#[derive(Default)]
struct IdentityReply {
    /// PEM, empty when no certificate was asked for.
    certificate_chain: String,
    /// PEM, empty when the plugin holds the current bundle.
    trust_bundle: String,
    renew_after: Option<Duration>,
}

/// Serves `kplug.v1alpha1.Registry` over the live registry.
#[derive(Clone)]
pub struct HeartbeatService {
    registry: Arc<Registry>,
    /// Cluster mode: who may heartbeat under which name. Without it
    /// (standalone mode, loopback only) callers are trusted.
    auth: Option<Arc<Delegated>>,
    /// The audience heartbeat tokens must be issued for; `None`: any.
    token_audience: Option<String>,
    /// Signs plugins' certificate requests; without it they are refused.
    signer: Option<Arc<Signer>>,
    metrics: HeartbeatMetrics,
    /// Identities denied lately, whose further denials cost no review.
    denials: Arc<Denials>,
    /// Log lines left for refusals.
    refusal_lines: Arc<LogBudget>,
    /// Turns true at shutdown, when open heartbeat streams end; without
    /// it they end only when their plugins end them.
    closing: Option<watch::Receiver<bool>>,
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
            token_audience: None,
            signer: None,
            metrics: HeartbeatMetrics::default(),
            denials: Arc::default(),
            refusal_lines: Arc::new(LogBudget::new(Instant::now())),
            closing: None,
        }
    }

    /// Ends every open heartbeat stream when `closing` turns true.
    pub fn with_closing(mut self, closing: watch::Receiver<bool>) -> Self {
        self.closing = Some(closing);
        self
    }

    /// Accepts only tokens issued for `audience` (empty: any).
    pub fn with_token_audience(mut self, audience: &str) -> Self {
        self.token_audience = (!audience.is_empty()).then(|| audience.to_owned());
        self
    }

    /// Signs the certificate requests of authorized heartbeats with `signer`.
    pub fn with_signer(mut self, signer: Option<Arc<Signer>>) -> Self {
        self.signer = signer;
        self
    }

    /// Counts into `metrics` (registered by the caller).
    pub fn with_metrics(mut self, metrics: HeartbeatMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The identity allowed to heartbeat under `name`, in cluster mode,
    /// from the token in a call's `metadata`.
    async fn authorize(
        &self,
        metadata: &MetadataMap,
        name: &str,
    ) -> Result<Option<String>, Status> {
        let Some(auth) = &self.auth else {
            return Ok(None);
        };
        let token = metadata
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
        let audience = self.token_audience.as_deref();
        let user =
            auth.review_token(token, audience)
                .await
                .map_err(|error| match (error, audience) {
                    (AuthError::Unauthenticated(message), Some(audience)) => {
                        Status::unauthenticated(format!(
                            "{message}; plugins heartbeat with a ServiceAccount token for audience \
                         {audience:?} (a projected token: serviceAccountToken.audience)"
                        ))
                    }
                    (error, _) => grpc_status(error),
                })?;
        let attributes = Attributes::heartbeat(name);
        let now = Instant::now();
        let over = self.denials.over(&user.name, now);
        let (decision, reviewed) = match over {
            // Only what needs no review: decisions cached, its own name's too.
            Some(ends) => match auth.cached(&user, &attributes) {
                Some(known) => (known, false),
                None => {
                    return Err(Status::permission_denied(format!(
                        "User {:?} was denied heartbeats {} times within {:?}: heartbeats under \
                         plugin names without a cached decision are refused without review for \
                         the next {:?}",
                        user.name,
                        denials::LIMIT,
                        denials::WINDOW,
                        ends.saturating_duration_since(now),
                    )));
                }
            },
            None => auth.decide(&user, &attributes).await,
        };
        // Only denials that cost a review count: a plugin whose RBAC is
        // wrong is denied from the cache between reviews.
        if reviewed && let Err(AuthError::Forbidden(_)) = &decision {
            self.denials.record(&user.name, now);
        }
        decision.map_err(grpc_status)?;
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
            ..HeartbeatResponse::default()
        }
    }

    /// The certificate for `request` (DER, empty for none) of an instance
    /// of `plugin`, and the trust bundle unless the instance holds it
    /// (`held`: its SHA-256).
    fn identity(&self, plugin: &str, request: &[u8], held: &[u8]) -> Result<IdentityReply, Status> {
        let Some(signer) = &self.signer else {
            if request.is_empty() {
                return Ok(IdentityReply::default());
            }
            return Err(Status::failed_precondition(
                "this kplug does not sign plugin certificates (it runs without \
                 --plugin-signing-cert-file): give the plugin its own certificate \
                 (KPLUG_TLS_CERT_FILE, see docs/src/guides/certificates.md) or configure kplug's plugin CA",
            ));
        };
        let (chain, renew_after) = if request.is_empty() {
            (String::new(), None)
        } else {
            let issued = signer.sign(plugin, request).map_err(|error| {
                tracing::info!(plugin, %error, "certificate request refused");
                match error {
                    SignError::Request(refused) => {
                        Status::invalid_argument(format!("certificate request refused: {refused}"))
                    }
                    internal @ SignError::Internal(_) => Status::internal(internal.to_string()),
                }
            })?;
            tracing::debug!(plugin, "plugin certificate issued");
            (issued.certificate_chain, Some(issued.renew_after))
        };
        let bundle = signer.trust_bundle();
        let send_bundle = !chain.is_empty() || held != bundle.sha256;
        Ok(IdentityReply {
            certificate_chain: chain,
            trust_bundle: if send_bundle {
                bundle.pem.to_string()
            } else {
                String::new()
            },
            renew_after,
        })
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
    /// One line per refused heartbeat, within [`log_budget`]'s bound.
    fn log_refusal(&self, plugin: &str, reason: &str) {
        match self.refusal_lines.spend(Instant::now()) {
            Verdict::Log { left_out: 0 } => tracing::info!(plugin, reason, "heartbeat refused"),
            Verdict::Log { left_out } => tracing::info!(
                plugin,
                reason,
                left_out,
                "heartbeat refused ({left_out} refusals before it not logged: more than {} within {:?})",
                log_budget::LINES,
                log_budget::WINDOW,
            ),
            Verdict::LeaveOut => {}
        }
    }

    /// Takes one heartbeat, sent on a call with `metadata`, and counts it.
    async fn take(
        &self,
        metadata: &MetadataMap,
        request: HeartbeatRequest,
    ) -> Result<HeartbeatResponse, Status> {
        let (answer, reply) = self.answer(metadata, request).await;
        self.metrics.heartbeat(answer);
        reply
    }

    /// One heartbeat's answer for the metrics, and its reply.
    async fn answer(
        &self,
        metadata: &MetadataMap,
        mut request: HeartbeatRequest,
    ) -> (Answer, Result<HeartbeatResponse, Status>) {
        let registered_by = match self.authorize(metadata, &request.name).await {
            Ok(registered_by) => registered_by,
            Err(status) => {
                self.log_refusal(&request.name, status.message());
                return (rejection(&status), Err(status));
            }
        };
        let certificate_request = std::mem::take(&mut request.certificate_request);
        let held_bundle = std::mem::take(&mut request.trust_bundle_sha256);
        let declaration = match declaration(request, &self.registry, registered_by) {
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
                return (Answer::Refused(REASON), Ok(refusal));
            }
        };
        let name = declaration.name.clone();
        let interval = declaration.interval;
        // Signed before the registry takes the heartbeat, so a request that
        // cannot be signed registers nothing; the identity was authorized above.
        let identity = match self.identity(&name, &certificate_request, &held_bundle) {
            Ok(identity) => identity,
            Err(status) => return (rejection(&status), Err(status)),
        };
        match self.registry.heartbeat(declaration, Timestamp::now()) {
            Ok(accepted) => (
                Answer::Accepted,
                Ok(HeartbeatResponse {
                    accepted: true,
                    reason: String::new(),
                    message: String::new(),
                    interval: prost_types::Duration::try_from(accepted.interval).ok(),
                    ttl: prost_types::Duration::try_from(accepted.ttl).ok(),
                    uid: accepted.uid,
                    server_protocol: Some(server_protocol()),
                    certificate_chain: identity.certificate_chain,
                    trust_bundle: identity.trust_bundle,
                    certificate_renew_after: identity
                        .renew_after
                        .and_then(|d| prost_types::Duration::try_from(d).ok()),
                }),
            ),
            Err(refusal) => {
                self.log_refusal(&name, &format!("{}: {refusal}", refusal.reason()));
                let reply = self.refusal(interval, refusal.reason(), refusal.to_string());
                (Answer::Refused(refusal.reason()), Ok(reply))
            }
        }
    }
}

/// An open `Heartbeats` call: what it was opened with and what comes on it.
struct HeartbeatStream {
    service: HeartbeatService,
    metadata: MetadataMap,
    inbound: Streaming<HeartbeatRequest>,
    closing: Option<watch::Receiver<bool>>,
}

impl HeartbeatStream {
    /// The answer to the next heartbeat, and the stream again unless that
    /// answer ends it; `None` once the plugin ended it, its call broke or
    /// kplug is closing.
    async fn next(mut self) -> Option<(Result<HeartbeatResponse, Status>, Option<Self>)> {
        let Self {
            inbound, closing, ..
        } = &mut self;
        let closing = async {
            match closing {
                Some(closing) => drop(closing.wait_for(|closing| *closing).await),
                None => std::future::pending().await,
            }
        };
        let request = tokio::select! {
            biased;
            () = closing => return None,
            request = inbound.message() => request,
        };
        // A broken call has no one to answer.
        let request = request.ok()??;
        // Boxed: an open stream waits in this future for the life of its
        // plugin instance, and taking a heartbeat (its review of the token
        // among it) would make the future several KiB larger.
        let taken = Box::pin(self.service.take(&self.metadata, request)).await;
        match taken {
            Ok(reply) => Some((Ok(reply), Some(self))),
            Err(status) => Some((Err(status), None)),
        }
    }
}

#[tonic::async_trait]
impl RegistryApi for HeartbeatService {
    async fn heartbeat(
        &self,
        request: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        let (metadata, _, request) = request.into_parts();
        self.take(&metadata, request).await.map(Response::new)
    }

    type HeartbeatsStream = Pin<Box<dyn Stream<Item = Result<HeartbeatResponse, Status>> + Send>>;

    async fn heartbeats(
        &self,
        request: Request<Streaming<HeartbeatRequest>>,
    ) -> Result<Response<Self::HeartbeatsStream>, Status> {
        let (metadata, _, inbound) = request.into_parts();
        let open = HeartbeatStream {
            service: self.clone(),
            metadata,
            inbound,
            closing: self.closing.clone(),
        };
        let answers = futures::stream::unfold(Some(open), |open| async move { open?.next().await });
        Ok(Response::new(Box::pin(answers)))
    }

    async fn deregister(
        &self,
        request: Request<DeregisterRequest>,
    ) -> Result<Response<DeregisterResponse>, Status> {
        let (metadata, _, request) = request.into_parts();
        self.authorize(&metadata, &request.name).await?;
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
