//! The DNS side: answers each question from the latest [`Zone`], over UDP
//! and TCP (hickory-server does the sockets, truncation and EDNS sizes).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Edns, Header, HeaderCounts, MessageType, Metadata, OpCode, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, Record, RecordType};
use hickory_server::Server;
use hickory_server::net::runtime::Time;
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponseBuilder;
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::watch;
use tracing::{debug, warn};

use crate::zone::{self, Rcode, Zone};

/// How long a TCP connection may stay idle between queries.
const TCP_IDLE: Duration = Duration::from_secs(10);
/// The outgoing buffer of one TCP connection, in responses.
const TCP_RESPONSE_BUFFER: usize = 32;

/// The latest zone; `None` until the watches of Services and Endpoints
/// have listed everything once.
pub type Latest = watch::Receiver<Option<Arc<Zone>>>;

/// A socket this server could not open.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {protocol} {addr}: {source}")]
pub struct BindError {
    pub protocol: &'static str,
    pub addr: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

/// Binds UDP and TCP on `addr`; with port 0, on one port that is free for
/// both (it tries a few).
pub async fn bind(addr: SocketAddr) -> Result<(UdpSocket, TcpListener), BindError> {
    let udp_error = |source| BindError {
        protocol: "udp",
        addr,
        source,
    };
    let tcp_error = |source| BindError {
        protocol: "tcp",
        addr,
        source,
    };
    let tries = if addr.port() == 0 { 20 } else { 1 };
    let mut last = None;
    for _ in 0..tries {
        let udp = UdpSocket::bind(addr).await.map_err(udp_error)?;
        let port = udp.local_addr().map_err(udp_error)?.port();
        match TcpListener::bind(SocketAddr::new(addr.ip(), port)).await {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(e) => last = Some(e),
        }
    }
    Err(tcp_error(last.unwrap_or_else(|| {
        std::io::Error::other("no port free for both UDP and TCP")
    })))
}

/// A DNS server answering from `latest` on these sockets.
pub fn serve(
    domain: Name,
    latest: Latest,
    sockets: Vec<(UdpSocket, TcpListener)>,
) -> Server<Handler> {
    let mut server = Server::new(Handler { domain, latest });
    for (udp, tcp) in sockets {
        server.register_socket(udp);
        server.register_listener(tcp, TCP_IDLE, TCP_RESPONSE_BUFFER);
    }
    server
}

/// Answers questions: REFUSED outside the domain (always, synced or not),
/// SERVFAIL inside it until the first sync, then from the zone.
pub struct Handler {
    domain: Name,
    latest: Latest,
}

/// What to answer, before it is encoded.
struct Reply {
    rcode: ResponseCode,
    authoritative: bool,
    answers: Vec<Record>,
    soa: Option<Record>,
}

impl Reply {
    fn error(rcode: ResponseCode) -> Self {
        Self {
            rcode,
            authoritative: false,
            answers: Vec::new(),
            soa: None,
        }
    }
}

impl Handler {
    fn reply(&self, request: &Request) -> Reply {
        if request.metadata.op_code != OpCode::Query {
            return Reply::error(ResponseCode::NotImp);
        }
        let Ok(info) = request.request_info() else {
            // Not exactly one question.
            return Reply::error(ResponseCode::FormErr);
        };
        let name = Name::from(info.query.name());
        let qtype = info.query.query_type();
        if !zone::in_domain(&self.domain, &name)
            || !matches!(info.query.query_class(), DNSClass::IN | DNSClass::ANY)
            || matches!(qtype, RecordType::AXFR | RecordType::IXFR)
        {
            return Reply::error(ResponseCode::Refused);
        }
        let Some(zone) = self.latest.borrow().clone() else {
            return Reply::error(ResponseCode::ServFail);
        };
        let answer = zone.lookup(&name, qtype);
        Reply {
            rcode: match answer.rcode {
                Rcode::NoError => ResponseCode::NoError,
                Rcode::NxDomain => ResponseCode::NXDomain,
                Rcode::Refused => ResponseCode::Refused,
                Rcode::ServFail => ResponseCode::ServFail,
            },
            authoritative: matches!(answer.rcode, Rcode::NoError | Rcode::NxDomain),
            answers: answer.answers,
            soa: answer.soa,
        }
    }
}

#[async_trait::async_trait]
impl RequestHandler for Handler {
    async fn handle_request<R: ResponseHandler, T: Time>(
        &self,
        request: &Request,
        mut response_handle: R,
    ) -> ResponseInfo {
        // EDNS as hickory's own Catalog does it: echo version 0 and the
        // client's payload size (at least 512).
        let edns = request.edns.as_ref().map(|asked| {
            let mut edns = Edns::new();
            edns.set_max_payload(asked.max_payload().max(512));
            edns.set_version(0);
            edns
        });
        let reply = if request.edns.as_ref().is_some_and(|e| e.version() > 0) {
            Reply::error(ResponseCode::BADVERS)
        } else {
            self.reply(request)
        };
        let mut metadata = Metadata::response_from_request(&request.metadata);
        metadata.message_type = MessageType::Response;
        metadata.response_code = reply.rcode;
        metadata.authoritative = reply.authoritative;
        // Nothing is forwarded: no recursion for anyone.
        metadata.recursion_available = false;
        debug!(
            question = ?request.queries.queries().first().map(|q| q.original().to_string()),
            rcode = %reply.rcode,
            answers = reply.answers.len(),
            "answer"
        );
        let response = MessageResponseBuilder::new(&request.queries, edns.as_ref()).build(
            metadata,
            reply.answers.iter(),
            std::iter::empty(),
            reply.soa.iter(),
            std::iter::empty(),
        );
        match response_handle.send_response(response).await {
            Ok(info) => info,
            Err(error) => {
                warn!(%error, "cannot send a response");
                let mut failed = Metadata::response_from_request(&request.metadata);
                failed.response_code = ResponseCode::ServFail;
                ResponseInfo::from(Header {
                    metadata: failed,
                    counts: HeaderCounts::default(),
                })
            }
        }
    }
}
