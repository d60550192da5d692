//! Heartbeat ingest: the gRPC `Registry` service that plugins call.

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

pub use validate::{FieldError, Invalid, declaration};

use crate::registry::Registry;

/// What the server announces it can do, so plugins can adapt.
const SERVER_CAPABILITIES: &[&str] = &["Deregister"];

/// Serves `kplug.v1alpha1.Registry` over the live registry.
#[derive(Clone)]
pub struct HeartbeatService {
    registry: Arc<Registry>,
}

impl HeartbeatService {
    pub fn new(registry: Arc<Registry>) -> Self {
        Self { registry }
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

#[tonic::async_trait]
impl RegistryApi for HeartbeatService {
    async fn heartbeat(
        &self,
        request: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        let declaration = match declaration(request.into_inner(), &self.registry, None) {
            Ok(declaration) => declaration,
            Err(Invalid::Fields(errors)) => {
                let invalid = Invalid::Fields(errors);
                tracing::debug!(error = %invalid, "heartbeat rejected");
                return Err(Status::invalid_argument(invalid.to_string()));
            }
            Err(unsupported @ Invalid::UnsupportedProtocol(_)) => {
                return Ok(Response::new(self.refusal(
                    self.registry.effective_interval(None),
                    "UnsupportedProtocol",
                    unsupported.to_string(),
                )));
            }
        };
        let name = declaration.name.clone();
        let interval = declaration.interval;
        match self.registry.heartbeat(declaration, Timestamp::now()) {
            Ok(accepted) => Ok(Response::new(HeartbeatResponse {
                accepted: true,
                reason: String::new(),
                message: String::new(),
                interval: prost_types::Duration::try_from(accepted.interval).ok(),
                ttl: prost_types::Duration::try_from(accepted.ttl).ok(),
                uid: accepted.uid,
                server_protocol: Some(server_protocol()),
            })),
            Err(refusal) => {
                tracing::info!(plugin = %name, reason = refusal.reason(), "heartbeat refused: {refusal}");
                Ok(Response::new(self.refusal(
                    interval,
                    refusal.reason(),
                    refusal.to_string(),
                )))
            }
        }
    }

    async fn deregister(
        &self,
        request: Request<DeregisterRequest>,
    ) -> Result<Response<DeregisterResponse>, Status> {
        let request = request.into_inner();
        if request.name.is_empty() || request.address.is_empty() {
            return Err(Status::invalid_argument(
                "invalid deregistration: name and address are required",
            ));
        }
        let removed = self.registry.deregister(&request.name, &request.address);
        if removed {
            tracing::info!(plugin = %request.name, "plugin deregistered");
        }
        Ok(Response::new(DeregisterResponse { removed }))
    }
}
