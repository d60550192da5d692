//! How a failed call is named and worded for the person who reads it in a
//! condition, an Event or a log line: which instance of which plugin, and
//! what happened in words, not a library's `Debug` dump.

use std::fmt;
use std::io::ErrorKind;
use std::time::Duration;

use super::{ProxyError, tls};
use crate::v1alpha1::{Operation, PluginInstance};

/// The instance of a plugin a call went to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub plugin: String,
    /// Its own name (its pod's); the address when it declared none.
    pub instance: String,
    pub address: String,
}

impl Target {
    pub(super) fn new(plugin: &str, instance: &PluginInstance) -> Self {
        Self {
            plugin: plugin.to_owned(),
            instance: instance.name.clone(),
            address: instance.address.clone(),
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self {
            plugin,
            instance,
            address,
        } = self;
        if instance.is_empty() || instance == address {
            write!(f, "plugin {plugin} at {address}")
        } else {
            write!(f, "plugin {plugin} instance {instance} at {address}")
        }
    }
}

/// The error a failed call to `target` is reported as.
pub(super) fn classify(
    target: Target,
    operation: Operation,
    timeouts: Timeouts,
    status: tonic::Status,
) -> ProxyError {
    if let Some(detail) = tls::failure(&status) {
        return ProxyError::Tls { target, detail };
    }
    // tonic's own timer for the grpc-timeout kplug sends can fire before
    // kplug's: it cancels the call with TimeoutExpired as the cause.
    if sources(&status).any(|e| e.is::<tonic::TimeoutExpired>()) {
        return ProxyError::DeadlineExceeded {
            target,
            timeout: timeouts.call,
        };
    }
    if let Some(reason) = broken_http2(&status) {
        return ProxyError::NotGrpc {
            target,
            detail: format!("kplug read {reason:?} from it"),
        };
    }
    match status.code() {
        tonic::Code::DeadlineExceeded => ProxyError::DeadlineExceeded {
            target,
            timeout: timeouts.call,
        },
        // A refused connection, or one that broke mid-call (the plugin
        // crashed): both mean "not now", never a success.
        tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled => {
            ProxyError::Unavailable {
                target,
                what: unreachable(&status, timeouts.connect),
            }
        }
        tonic::Code::InvalidArgument => ProxyError::Rejected {
            target,
            message: status.message().to_owned(),
        },
        tonic::Code::Unimplemented => ProxyError::Unimplemented {
            plugin: target.plugin,
            operation: operation.as_str().to_owned(),
        },
        // tonic's own refusal of a message over the decoding limit; a
        // plugin could also say OUT_OF_RANGE itself, worded as its own.
        tonic::Code::OutOfRange if status.message().contains("message length too large") => {
            ProxyError::AnswerTooLarge {
                target,
                detail: status.message().to_owned(),
            }
        }
        tonic::Code::ResourceExhausted => ProxyError::Busy {
            plugin: target.plugin,
            limit: 0,
        },
        code => ProxyError::Failed {
            target,
            code,
            message: status.message().to_owned(),
        },
    }
}

/// The deadlines a call ran under, for messages.
#[derive(Clone, Copy, Debug)]
pub(super) struct Timeouts {
    /// The whole call's.
    pub(super) call: Duration,
    /// A connection's.
    pub(super) connect: Duration,
}

/// What went wrong with a call that ended without the plugin's answer, as
/// the predicate of a sentence about the instance: "refused the
/// connection", "closed the connection during the call".
fn unreachable(status: &tonic::Status, connect_timeout: Duration) -> String {
    let connecting = is_connect_error(status);
    if let Some(kind) = io_error_kind(status) {
        let what = match kind {
            ErrorKind::ConnectionRefused => Some("refused the connection (nothing listens there)"),
            ErrorKind::HostUnreachable | ErrorKind::NetworkUnreachable => {
                Some("cannot be reached (no route to its address)")
            }
            ErrorKind::ConnectionReset | ErrorKind::BrokenPipe | ErrorKind::UnexpectedEof
                if !connecting =>
            {
                Some("closed the connection during the call")
            }
            _ => None,
        };
        if let Some(what) = what {
            return what.to_owned();
        }
        if kind == ErrorKind::TimedOut && connecting {
            return format!("did not accept a connection within {connect_timeout:?}");
        }
    }
    if connecting {
        return format!("cannot be connected to: {}", text(status));
    }
    // The plugin's own UNAVAILABLE, or a transport failure without an I/O
    // error, such as hyper's "connection closed before message completed".
    if let Some(closed) = hyper_closed(status) {
        return closed.to_owned();
    }
    let text = text(status);
    match status.code() {
        tonic::Code::Unavailable if !text.is_empty() => format!("answered UNAVAILABLE: {text}"),
        code => format!("failed ({}): {text}", code.description()),
    }
}

/// The status's message and the chain of errors behind it, without the
/// code that `tonic::Status`'s own Display puts first.
fn text(status: &tonic::Status) -> String {
    let mut text = status.message().to_owned();
    if let Some(source) = std::error::Error::source(status) {
        let causes = tls::causes(source);
        if !causes.is_empty() && !text.ends_with(&causes) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&causes);
        }
    }
    text
}

/// The HTTP/2 error kplug's side found in what the plugin sent (bytes that
/// are not HTTP/2 frames, frames too large, a header block that does not
/// decode): not a gRPC server at that address, or a broken one.
fn broken_http2(status: &tonic::Status) -> Option<h2::Reason> {
    sources(status)
        .filter_map(|e| e.downcast_ref::<h2::Error>())
        .filter(|h2| !h2.is_remote() && !h2.is_io())
        .filter_map(h2::Error::reason)
        .find(|reason| {
            [
                h2::Reason::PROTOCOL_ERROR,
                h2::Reason::FRAME_SIZE_ERROR,
                h2::Reason::COMPRESSION_ERROR,
            ]
            .contains(reason)
        })
}

fn sources(status: &tonic::Status) -> impl Iterator<Item = &(dyn std::error::Error + 'static)> {
    std::iter::successors(std::error::Error::source(status), |e| e.source())
}

fn is_connect_error(status: &tonic::Status) -> bool {
    sources(status).any(|e| e.is::<tonic::ConnectError>())
}

fn io_error_kind(status: &tonic::Status) -> Option<ErrorKind> {
    sources(status).find_map(|e| e.downcast_ref::<std::io::Error>().map(std::io::Error::kind))
}

/// How hyper saw the connection close, when it did: a request it had
/// queued is cancelled before it was sent, so the plugin never saw it.
fn hyper_closed(status: &tonic::Status) -> Option<&'static str> {
    sources(status)
        .filter_map(|e| e.downcast_ref::<hyper::Error>())
        .find_map(|h| {
            if h.is_canceled() {
                Some("closed the connection before the call reached it")
            } else if h.is_incomplete_message() || h.is_closed() {
                Some("closed the connection during the call")
            } else {
                None
            }
        })
}
