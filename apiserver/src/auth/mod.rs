//! Authentication and authorization of API requests.
//!
//! In standalone mode a request is authenticated by an x509 client
//! certificate that chains to kplug's own CA (rustls has verified the chain
//! during the handshake); every authenticated user may do everything.
//! Cluster mode (delegated authentication and SubjectAccessReviews) is not
//! built yet.

use std::sync::Arc;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rustls::pki_types::CertificateDer;

use crate::api::status::ApiError;

/// An authenticated user, as Kubernetes names one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
}

impl User {
    /// The user a verified client certificate names: CN is the user, each O a group.
    pub fn from_certificate(der: &CertificateDer<'_>) -> Option<Self> {
        let (_, certificate) = x509_parser::parse_x509_certificate(der).ok()?;
        let subject = certificate.subject();
        let name = subject.iter_common_name().next()?.as_str().ok()?.to_owned();
        let groups = subject
            .iter_organization()
            .filter_map(|o| o.as_str().ok().map(str::to_owned))
            .collect();
        Some(Self { name, groups })
    }
}

/// What the TLS layer learned about the connection's peer; attached to
/// every request on that connection.
#[derive(Debug, Clone, Default)]
pub struct Peer {
    /// The user of a client certificate that rustls verified, if any.
    pub certificate_user: Option<Arc<User>>,
}

/// Middleware: rejects unauthenticated requests with a `401` Status and
/// makes the [`User`] available to handlers.
pub async fn authenticate(mut request: Request, next: Next) -> Response {
    let user = request
        .extensions()
        .get::<Peer>()
        .and_then(|peer| peer.certificate_user.clone());
    match user {
        Some(user) => {
            request.extensions_mut().insert(user);
            next.run(request).await
        }
        None => ApiError::Unauthorized(
            "Unauthorized: a client certificate signed by kplug's CA is required".to_owned(),
        )
        .into_response(),
    }
}
