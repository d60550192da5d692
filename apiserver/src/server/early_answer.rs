//! Answers given before the request body is read reach the client.
//!
//! kplug answers some requests without reading all of their body: `401`
//! and `403` at the edge, `405`, `413` once more than `--max-request-bytes`
//! came. RFC 9113 section 8.1 allows it, but left alone clients lose such
//! answers (curl 7.88 straight to kplug, measured):
//!
//! - HTTP/2: h2 resets the stream (`RST_STREAM(NO_ERROR)`) once the answer
//!   is sent and the body dropped; curl, still sending, fails without
//!   reading the answer (`(92) Stream error in the HTTP/2 framing layer`),
//!   in most tries even for a 2-byte body. A client that reads the answer
//!   first and then ends its body short of its `content-length` gets a
//!   `RST_STREAM(PROTOCOL_ERROR)` that h2 sends at once, dropping the part
//!   of the answer still queued (about 1 try in 100).
//! - HTTP/1.1: hyper closes a connection whose request body is unread;
//!   closing with the client's bytes unread makes the kernel send a reset,
//!   which can destroy the answer before the client reads it (`(55) Send
//!   failure: Broken pipe`).
//!
//! So the rest of the body is read and thrown away *before* the answer: the
//! client finishes its request as it meant to, then reads the answer, and
//! the stream closes without a reset (the HTTP/1.1 connection stays
//! usable). The cost is bounded: at most [`DRAIN_MAX_BYTES`] for at most
//! [`DRAIN_TIMEOUT`]; beyond either the answer goes out and the body is
//! dropped, as before. Reading costs kplug about what sending costs the
//! client. A client that sent `Expect: 100-continue` has sent no body and
//! waits for the answer: it gets it at once, and no `100 Continue`.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use http::header::EXPECT;
use http_body_util::BodyExt;
use hyper::body::{Frame, SizeHint};
use tokio::sync::oneshot;

/// How long the rest of a refused body is read before the answer goes out
/// anyway: a slow client's large body should not delay its answer longer.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// How much of it is read: ten times the largest body kplug accepts by
/// default, so that refused bodies of ordinary sizes all finish.
pub const DRAIN_MAX_BYTES: usize = 32 << 20;

/// What reading an unread body may cost.
#[derive(Clone, Copy, Debug)]
pub struct DrainLimits {
    pub max_bytes: usize,
    pub timeout: Duration,
}

/// Middleware: gives the handler the body; if the handler answers without
/// reading all of it, reads the rest (within `limits`) before answering.
pub async fn drain_unread(
    State(limits): State<DrainLimits>,
    request: Request,
    next: Next,
) -> Response {
    let (parts, body) = request.into_parts();
    if hyper::body::Body::is_end_stream(&body) {
        return next.run(Request::from_parts(parts, body)).await;
    }
    let waits_for_continue = expects_continue(&parts.headers);
    let (mut returned, body) = ReturnOnDrop::new(body);
    let response = next.run(Request::from_parts(parts, Body::new(body))).await;
    // A body the handler read to its end, or still holds, is not returned.
    if let Ok(rest) = returned.try_recv() {
        // Unread, the client sent none of it: hyper sends `100 Continue`
        // only when the body is first read.
        let sent_nothing = waits_for_continue && !rest.read_from;
        if !sent_nothing {
            drain(rest.body, limits).await;
        }
    }
    response
}

fn expects_continue(headers: &http::HeaderMap) -> bool {
    headers
        .get(EXPECT)
        .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

/// Reads and discards `body` to its end, or until `limits` are reached.
async fn drain(mut body: Body, limits: DrainLimits) {
    let mut read = 0usize;
    let ended = tokio::time::timeout(limits.timeout, async {
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(frame) => {
                    read += frame.data_ref().map_or(0, |data| data.len());
                    if read > limits.max_bytes {
                        return "over the byte limit";
                    }
                }
                Err(_) => return "ended early",
            }
        }
        "ended"
    })
    .await
    .unwrap_or("timed out");
    tracing::debug!(
        bytes = read,
        outcome = ended,
        "read the rest of a refused request's body"
    );
}

/// A body that, dropped before its end, hands its rest back.
struct ReturnOnDrop {
    body: Option<Body>,
    back: Option<oneshot::Sender<Unread>>,
    read_from: bool,
}

/// The rest of a body its handler dropped.
struct Unread {
    body: Body,
    /// Whether the handler read any of it.
    read_from: bool,
}

impl ReturnOnDrop {
    fn new(body: Body) -> (oneshot::Receiver<Unread>, Self) {
        let (back, returned) = oneshot::channel();
        (
            returned,
            Self {
                body: Some(body),
                back: Some(back),
                read_from: false,
            },
        )
    }
}

impl Drop for ReturnOnDrop {
    fn drop(&mut self) {
        if let (Some(body), Some(back)) = (self.body.take(), self.back.take())
            && !hyper::body::Body::is_end_stream(&body)
        {
            let _ = back.send(Unread {
                body,
                read_from: self.read_from,
            });
        }
    }
}

impl hyper::body::Body for ReturnOnDrop {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        self.read_from = true;
        match self.body.as_mut() {
            Some(body) => std::pin::Pin::new(body).poll_frame(cx),
            None => std::task::Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body
            .as_ref()
            .is_none_or(hyper::body::Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.body
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), hyper::body::Body::size_hint)
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use http_body_util::StreamBody;

    use super::*;

    fn streaming(chunks: usize) -> (tokio::sync::mpsc::Sender<Frame<bytes::Bytes>>, Body) {
        let (tx, rx) = tokio::sync::mpsc::channel::<Frame<bytes::Bytes>>(chunks.max(1));
        let stream =
            tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<_, std::convert::Infallible>);
        (tx, Body::new(StreamBody::new(stream)))
    }

    #[tokio::test]
    async fn a_body_dropped_unread_comes_back() {
        let (tx, body) = streaming(1);
        let (returned, wrapped) = ReturnOnDrop::new(body);
        drop(wrapped);
        let Unread {
            body: mut back,
            read_from,
        } = returned.await.expect("the unread body comes back");
        assert!(!read_from);
        tx.send(Frame::data(bytes::Bytes::from_static(b"rest")))
            .await
            .expect("the body is still there to send to");
        drop(tx);
        let frame = back.frame().await.expect("a frame").expect("data");
        assert_eq!(frame.data_ref().map(|d| &d[..]), Some(&b"rest"[..]));
    }

    #[tokio::test]
    async fn a_body_read_in_part_comes_back_marked_read() {
        // As axum's body limit leaves one: the first chunk read, then refused.
        let (tx, body) = streaming(2);
        tx.send(Frame::data(bytes::Bytes::from_static(b"first")))
            .await
            .expect("room in the channel");
        let (returned, mut wrapped) = ReturnOnDrop::new(body);
        wrapped.frame().await.expect("a frame").expect("data");
        drop(wrapped);
        let rest = returned.await.expect("the rest comes back");
        assert!(rest.read_from, "the client was asked for the body");
    }

    #[test]
    fn only_a_100_continue_expectation_counts() {
        let expecting = |value: &'static str| {
            let mut headers = http::HeaderMap::new();
            headers.insert(EXPECT, http::HeaderValue::from_static(value));
            expects_continue(&headers)
        };
        assert!(expecting("100-continue"));
        assert!(expecting("100-Continue"));
        assert!(!expecting("something-else"));
        assert!(!expects_continue(&http::HeaderMap::new()));
    }

    #[tokio::test]
    async fn a_body_read_to_its_end_does_not_come_back() {
        let (returned, mut wrapped) = ReturnOnDrop::new(Body::from("whole"));
        let bytes = (&mut wrapped).collect().await.expect("readable").to_bytes();
        assert_eq!(&bytes[..], b"whole");
        drop(wrapped);
        assert!(returned.await.is_err(), "nothing to drain");
    }

    #[tokio::test(start_paused = true)]
    async fn draining_stops_at_the_byte_limit_and_the_timeout() {
        let limits = DrainLimits {
            max_bytes: 8,
            timeout: Duration::from_secs(5),
        };
        // Over the byte limit: the drain returns although the sender lives.
        let (tx, body) = streaming(4);
        for _ in 0..3 {
            tx.send(Frame::data(bytes::Bytes::from_static(b"1234")))
                .await
                .expect("room in the channel");
        }
        drain(body, limits).await;
        assert!(tx.is_closed(), "the body was dropped after 12 bytes");

        // Silent sender: the drain gives up at the timeout.
        let (tx, body) = streaming(1);
        let started = tokio::time::Instant::now();
        drain(body, limits).await;
        assert_eq!(started.elapsed(), limits.timeout);
        assert!(tx.is_closed());
    }
}
