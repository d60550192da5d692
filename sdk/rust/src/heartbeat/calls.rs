//! How heartbeats reach one replica: as messages on one long-lived
//! `Heartbeats` stream, or, to a kplug from before streams, as a call each.
//! A message on an open stream costs both sides a fraction of a call.

use kplug_proto::v1alpha1::registry_client::RegistryClient;
use kplug_proto::v1alpha1::{
    DeregisterRequest, DeregisterResponse, HeartbeatRequest, HeartbeatResponse,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status, Streaming};
use tracing::{debug, info};

/// An open `Heartbeats` call.
struct Open {
    requests: mpsc::Sender<HeartbeatRequest>,
    answers: Streaming<HeartbeatResponse>,
    /// The token it was opened with; kplug checks that token for every
    /// heartbeat on it, so a new token needs a new call.
    authorization: Option<AsciiMetadataValue>,
    /// A heartbeat went out whose answer was not read (it was abandoned):
    /// the next answer on this call would be that one's.
    awaiting: bool,
}

/// The calls to one replica.
pub(super) struct Calls {
    endpoint: Endpoint,
    client: RegistryClient<Channel>,
    open: Option<Open>,
    /// The replica answered `UNIMPLEMENTED` to a stream: a call each.
    one_call_each: bool,
}

/// Whether a heartbeat on a stream opened before it gets one more try, on
/// a new stream: when the stream had ended (the replica closed it, as
/// kplug does when it shuts down) or its connection broke (the error has a
/// transport cause), which happens between two heartbeats. A status the
/// replica answered with stands.
fn worth_a_new_call(answer: &Option<Result<HeartbeatResponse, Status>>) -> bool {
    match answer {
        None => true,
        Some(Err(status)) => std::error::Error::source(status).is_some(),
        Some(Ok(_)) => false,
    }
}

impl Calls {
    pub(super) fn new(endpoint: Endpoint) -> Self {
        Self {
            client: RegistryClient::new(endpoint.connect_lazy()),
            endpoint,
            open: None,
            one_call_each: false,
        }
    }

    /// Dials afresh: a connection whose peer vanished without closing it
    /// looks healthy to the channel forever.
    pub(super) fn redial(&mut self) {
        self.open = None;
        self.client = RegistryClient::new(self.endpoint.connect_lazy());
    }

    /// Sends one heartbeat and reads its answer.
    pub(super) async fn heartbeat(
        &mut self,
        message: HeartbeatRequest,
        authorization: Option<AsciiMetadataValue>,
    ) -> Result<HeartbeatResponse, Status> {
        if self.one_call_each {
            return self.call(message, authorization).await;
        }
        if self
            .open
            .as_ref()
            .is_some_and(|open| open.awaiting || open.authorization != authorization)
        {
            self.open = None;
        }
        let opened_before = self.open.is_some();
        if !opened_before {
            match self.open(authorization.clone()).await {
                Ok(open) => self.open = Some(open),
                Err(status) if status.code() == Code::Unimplemented => {
                    info!(
                        "this kplug takes no heartbeat stream (no \"HeartbeatStream\" capability): \
                         sending each heartbeat as a call"
                    );
                    self.one_call_each = true;
                    return self.call(message, authorization).await;
                }
                Err(status) => return Err(status),
            }
        }
        // Kept for one more try only where one may come.
        let again = opened_before.then(|| message.clone());
        let mut answer = self.exchange(message).await;
        if let Some(message) = again
            && worth_a_new_call(&answer)
        {
            debug!("the heartbeat stream had ended; opening another");
            self.open = Some(self.open(authorization).await?);
            answer = self.exchange(message).await;
        }
        answer.unwrap_or_else(|| {
            Err(Status::unavailable(
                "kplug ended the heartbeat stream without answering",
            ))
        })
    }

    /// One heartbeat as a call of its own.
    async fn call(
        &mut self,
        message: HeartbeatRequest,
        authorization: Option<AsciiMetadataValue>,
    ) -> Result<HeartbeatResponse, Status> {
        let request = request(message, authorization);
        Ok(self.client.heartbeat(request).await?.into_inner())
    }

    /// Best effort, with `authorization`.
    pub(super) async fn deregister(
        &mut self,
        message: DeregisterRequest,
        authorization: Option<AsciiMetadataValue>,
    ) -> Result<DeregisterResponse, Status> {
        self.open = None;
        let request = request(message, authorization);
        Ok(self.client.deregister(request).await?.into_inner())
    }

    async fn open(&mut self, authorization: Option<AsciiMetadataValue>) -> Result<Open, Status> {
        // One heartbeat at a time goes out on a stream.
        let (requests, outbound) = mpsc::channel(1);
        let request = request(ReceiverStream::new(outbound), authorization.clone());
        let answers = self.client.heartbeats(request).await?.into_inner();
        Ok(Open {
            requests,
            answers,
            authorization,
            awaiting: false,
        })
    }

    /// The answer to `message` on the open stream; `None` when the stream
    /// had ended. A stream that ends or breaks is dropped.
    async fn exchange(
        &mut self,
        message: HeartbeatRequest,
    ) -> Option<Result<HeartbeatResponse, Status>> {
        let open = self.open.as_mut()?;
        if open.requests.send(message).await.is_err() {
            self.open = None;
            return None;
        }
        open.awaiting = true;
        let answer = open.answers.message().await;
        open.awaiting = false;
        match answer {
            Ok(Some(reply)) => Some(Ok(reply)),
            Ok(None) => {
                self.open = None;
                None
            }
            Err(status) => {
                self.open = None;
                Some(Err(status))
            }
        }
    }
}

/// `message` as a request, with the token when there is one.
fn request<T>(message: T, authorization: Option<AsciiMetadataValue>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(authorization) = authorization {
        request
            .metadata_mut()
            .insert("authorization", authorization);
    }
    request
}
