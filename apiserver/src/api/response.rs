//! Response bodies: serialized values, and bodies written piece by piece
//! from cached bytes, sent whole when small and streamed when large.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::negotiate::{Representation, TableVersion};
use super::status::ApiError;

/// A streamed body is sent in pieces of about this size: large enough that
/// framing and TLS records cost little per byte, small enough that a list
/// never holds more than a few of them (hyper buffers a bounded amount per
/// stream), so memory does not grow with the size or number of lists.
pub const CHUNK_BYTES: usize = 64 * 1024;

/// Serializes a response body, with the content type of its representation.
pub fn json_response(body: &impl Serialize, content_type: &'static str) -> Response {
    match serde_json::to_vec(body) {
        Ok(bytes) => bytes_response(Bytes::from(bytes), content_type),
        Err(e) => ApiError::Internal(format!("encoding the response: {e}")).into_response(),
    }
}

/// A whole body with its content type.
pub fn bytes_response(body: Bytes, content_type: &'static str) -> Response {
    (
        [(header::CONTENT_TYPE, HeaderValue::from_static(content_type))],
        body,
    )
        .into_response()
}

/// Content type of a response in `repr`.
pub fn table_content_type(repr: Representation) -> &'static str {
    match repr {
        Representation::Table(TableVersion::V1beta1) => {
            "application/json;as=Table;v=v1beta1;g=meta.k8s.io"
        }
        Representation::Table(_) => "application/json;as=Table;v=v1;g=meta.k8s.io",
        Representation::Json => "application/json",
    }
}

/// A body written in order, one piece at a time, into a buffer.
pub trait BodyWriter: Send + 'static {
    /// Appends the next piece to `out`; false once the body is complete.
    fn write_next(&mut self, out: &mut Vec<u8>) -> bool;
}

/// Writes `writer`'s body: as one piece (with a Content-Length) when it
/// fits in [`CHUNK_BYTES`], else as a stream of pieces of about that size,
/// each written when the connection can take it.
pub fn written_response(mut writer: impl BodyWriter, content_type: &'static str) -> Response {
    let first = fill(&mut writer);
    let body = match first {
        (piece, false) => Body::from(piece),
        (piece, true) => {
            let mut pending = Some(piece);
            let mut writer = Some(writer);
            let pieces = std::iter::from_fn(move || {
                if let Some(piece) = pending.take() {
                    return Some(piece);
                }
                let (piece, more) = fill(writer.as_mut()?);
                if !more {
                    writer = None;
                }
                (!piece.is_empty()).then_some(piece)
            });
            Body::from_stream(futures::stream::iter(pieces.map(Ok::<_, Infallible>)))
        }
    };
    let mut response = body.into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// The next piece of about [`CHUNK_BYTES`], and whether more follows.
fn fill(writer: &mut impl BodyWriter) -> (Bytes, bool) {
    // Room for one more object past the threshold, so the buffer rarely grows.
    let mut out = Vec::with_capacity(CHUNK_BYTES + CHUNK_BYTES / 4);
    let mut more = true;
    while more && out.len() < CHUNK_BYTES {
        more = writer.write_next(&mut out);
    }
    (Bytes::from(out), more)
}
