//! Authentication and authorization of API requests.
//!
//! Standalone mode trusts x509 client certificates of its own CA (rustls
//! verified the chain during the handshake) and lets every authenticated
//! user do everything. Cluster mode delegates both decisions to
//! kube-apiserver ([`delegated`]). Refusals are [`AuthError`]s; the
//! server's middleware answers them as Kubernetes `Status` objects.

pub mod attributes;
pub mod cache;
pub mod delegated;
pub mod metrics;
pub mod resources;
pub mod verifier;

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::http::request::Parts;
use rustls::pki_types::CertificateDer;
use serde::Serialize;

pub use attributes::{Attributes, RequestInfo};
use delegated::Delegated;

/// Why a caller was refused. Its own type, so that authentication does not
/// depend on the HTTP surface: the edges map it, to a Kubernetes `Status`
/// (`api::status`) or to a gRPC status (`heartbeat`). The messages are the
/// ones clients see.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// Who is calling is unknown (`401 Unauthorized`).
    #[error("{0}")]
    Unauthenticated(String),
    /// A bearer token could not be reviewed: the caller stays unknown.
    #[error("Unauthorized: the token could not be reviewed: {}", crate::kube_words::kube_error(.0))]
    TokenReview(#[source] kube::Error),
    /// The caller may not do this (`403 Forbidden`).
    #[error("{0}")]
    Forbidden(String),
    /// kube-apiserver could not be asked: a failure of ours, not a denial.
    #[error("authorization check failed: {}", crate::kube_words::kube_error(.0))]
    AccessReview(#[source] kube::Error),
}

/// An authenticated user, as Kubernetes names one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl User {
    /// The user a client certificate names: CN is the user, each O a group.
    pub fn from_certificate(der: &CertificateDer<'_>) -> Option<Self> {
        let (_, certificate) = x509_parser::parse_x509_certificate(der).ok()?;
        let subject = certificate.subject();
        let name = subject.iter_common_name().next()?.as_str().ok()?.to_owned();
        let groups = subject
            .iter_organization()
            .filter_map(|o| o.as_str().ok().map(str::to_owned))
            .collect();
        Some(Self {
            name,
            groups,
            extra: BTreeMap::new(),
        })
    }
}

/// What a connection's client certificate proves; attached to every
/// request on that connection.
#[derive(Debug, Clone, Default)]
pub enum PeerIdentity {
    /// No certificate, or one that proves nothing.
    #[default]
    Anonymous,
    /// A client certificate naming a user.
    User(Arc<User>),
    /// kube-apiserver's front proxy, which asserts users in headers.
    FrontProxy { common_name: String, allowed: bool },
}

/// How requests are authenticated and authorized.
pub enum Auth {
    /// Client certificates of kplug's own CA; everyone authenticated may do everything.
    Standalone,
    /// kube-apiserver decides.
    Delegated(Arc<Delegated>),
}

impl Auth {
    /// What a verified certificate chain (end entity first) proves.
    pub fn identify(&self, chain: &[CertificateDer<'_>]) -> PeerIdentity {
        match self {
            // The handshake accepted only certificates of kplug's CA.
            Self::Standalone => chain
                .first()
                .and_then(User::from_certificate)
                .map_or(PeerIdentity::Anonymous, |user| {
                    PeerIdentity::User(Arc::new(user))
                }),
            Self::Delegated(delegated) => delegated.identify(chain),
        }
    }

    /// The user behind a request, if they may make it; a refusal is
    /// logged (at debug, under this module) with the path.
    pub async fn check(&self, request: &Parts) -> Result<User, AuthError> {
        let decision = self.decide(request).await;
        if let Err(error) = &decision {
            tracing::debug!(path = %request.uri.path(), %error, "request refused");
        }
        decision
    }

    async fn decide(&self, request: &Parts) -> Result<User, AuthError> {
        let peer = request
            .extensions
            .get::<PeerIdentity>()
            .cloned()
            .unwrap_or_default();
        match self {
            Self::Standalone => match peer {
                PeerIdentity::User(user) => Ok((*user).clone()),
                _ => Err(AuthError::Unauthenticated(
                    "Unauthorized: a client certificate signed by kplug's CA is required"
                        .to_owned(),
                )),
            },
            Self::Delegated(delegated) => {
                let user = delegated.authenticate(&peer, &request.headers).await?;
                let attributes = Attributes::of_request(
                    &request.method,
                    request.uri.path(),
                    request.uri.query(),
                );
                delegated.authorize(&user, &attributes).await?;
                Ok(user)
            }
        }
    }
}
