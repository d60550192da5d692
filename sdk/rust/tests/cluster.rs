//! Heartbeats to kplug in cluster mode: TLS with a CA of the test's own,
//! and a ServiceAccount token in the `authorization` metadata, against a
//! fake registry that checks both the way kplug does. Every wait is
//! bounded so that a hang fails instead of stalling the suite.

mod support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kplug_sdk::heartbeat::Outcome;
use kplug_sdk::proto::v1alpha1::registry_server::{Registry, RegistryServer};
use kplug_sdk::proto::v1alpha1::{
    DeregisterRequest, DeregisterResponse, HeartbeatRequest, HeartbeatResponse,
};
use kplug_sdk::{ApiRef, Config, Error, Heartbeater, Plugin, PluginInfo, Request, Status};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::TcpListenerStream;
use tonic::Code;
use tonic::transport::{Identity, ServerTlsConfig};

use support::{Answers, Client, PATIENCE, answer_each, assert_gaps_at_least};

/// kplug's message for a call without a token.
const NO_TOKEN: &str = "a ServiceAccount token is required";

/// A CA and a serving certificate it signed, as PEM.
struct Pki {
    ca: String,
    cert: String,
    key: String,
}

/// A fresh CA and a certificate for `localhost`, `127.0.0.1` and `::1`.
fn pki() -> Pki {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "kplug test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);

    let key = KeyPair::generate().unwrap();
    let mut params =
        CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into(), "::1".into()]).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "kplug.kplug-system.svc");
    let cert = params.signed_by(&key, &issuer).unwrap();
    Pki {
        ca: ca.pem(),
        cert: cert.pem(),
        key: key.serialize_pem(),
    }
}

/// Something the fake registry received, with the token it carried.
#[derive(Debug)]
enum Call {
    Heartbeat {
        token: Option<String>,
        at: Instant,
    },
    Deregister {
        token: Option<String>,
        request: DeregisterRequest,
    },
}

/// What the fake lets through, changeable while it runs.
#[derive(Default)]
struct Policy {
    /// Tokens that authenticate; others are UNAUTHENTICATED.
    tokens: Vec<String>,
    /// How many authenticated heartbeats to refuse as PERMISSION_DENIED.
    deny: u32,
}

/// Checks the `authorization` metadata as kplug in cluster mode does: on a
/// stream, the stream's, for every heartbeat on it.
#[derive(Clone)]
struct FakeRegistry {
    policy: Arc<Mutex<Policy>>,
    interval: Duration,
    calls: mpsc::UnboundedSender<Call>,
}

/// The bearer token of a call, if any.
fn bearer<T>(request: &tonic::Request<T>) -> Option<String> {
    let value = request.metadata().get("authorization")?.to_str().ok()?;
    let token = value.strip_prefix("Bearer ")?;
    Some(token.to_owned())
}

impl FakeRegistry {
    #[allow(clippy::result_large_err)] // tonic's error type
    fn authenticate(&self, token: Option<&str>) -> Result<(), tonic::Status> {
        let Some(token) = token else {
            return Err(tonic::Status::unauthenticated(format!(
                "{NO_TOKEN}: send it as \"authorization: Bearer TOKEN\""
            )));
        };
        if !self
            .policy
            .lock()
            .unwrap()
            .tokens
            .iter()
            .any(|t| t == token)
        {
            return Err(tonic::Status::unauthenticated(
                "Unauthorized: invalid bearer token",
            ));
        }
        Ok(())
    }
}

impl FakeRegistry {
    /// The answer to a heartbeat of `name` that came with `token`.
    #[allow(clippy::result_large_err)] // tonic's error type
    fn answer(
        &self,
        token: Option<String>,
        name: &str,
    ) -> Result<HeartbeatResponse, tonic::Status> {
        let _ = self.calls.send(Call::Heartbeat {
            token: token.clone(),
            at: Instant::now(),
        });
        self.authenticate(token.as_deref())?;
        {
            let mut policy = self.policy.lock().unwrap();
            if policy.deny > 0 {
                policy.deny -= 1;
                return Err(tonic::Status::permission_denied(format!(
                    "system:serviceaccount:plugins:hello may not create plugins/heartbeat {name:?}"
                )));
            }
        }
        Ok(HeartbeatResponse {
            accepted: true,
            interval: Some(self.interval.try_into().unwrap()),
            ttl: Some((self.interval * 3).try_into().unwrap()),
            uid: "uid-1".into(),
            ..Default::default()
        })
    }
}

#[tonic::async_trait]
impl Registry for FakeRegistry {
    async fn heartbeat(
        &self,
        request: tonic::Request<HeartbeatRequest>,
    ) -> Result<tonic::Response<HeartbeatResponse>, tonic::Status> {
        let token = bearer(&request);
        self.answer(token, &request.get_ref().name)
            .map(tonic::Response::new)
    }

    type HeartbeatsStream = Answers;

    async fn heartbeats(
        &self,
        request: tonic::Request<tonic::Streaming<HeartbeatRequest>>,
    ) -> Result<tonic::Response<Answers>, tonic::Status> {
        let token = bearer(&request);
        let fake = self.clone();
        let answers = answer_each(request.into_inner(), move |request| {
            (fake.answer(token.clone(), &request.name), false)
        });
        Ok(tonic::Response::new(answers))
    }

    async fn deregister(
        &self,
        request: tonic::Request<DeregisterRequest>,
    ) -> Result<tonic::Response<DeregisterResponse>, tonic::Status> {
        let token = bearer(&request);
        let _ = self.calls.send(Call::Deregister {
            token: token.clone(),
            request: request.get_ref().clone(),
        });
        self.authenticate(token.as_deref())?;
        Ok(tonic::Response::new(DeregisterResponse { removed: true }))
    }
}

/// The fake registry over TLS, served until dropped.
struct Server {
    addr: SocketAddr,
    policy: Arc<Mutex<Policy>>,
    calls: mpsc::UnboundedReceiver<Call>,
    _stop: oneshot::Sender<()>,
}

impl Server {
    async fn start(pki: &Pki, interval: Duration, tokens: &[&str]) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let policy = Arc::new(Mutex::new(Policy {
            tokens: tokens.iter().map(|t| (*t).to_owned()).collect(),
            deny: 0,
        }));
        let (calls_tx, calls) = mpsc::unbounded_channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let fake = FakeRegistry {
            policy: policy.clone(),
            interval,
            calls: calls_tx,
        };
        let tls = ServerTlsConfig::new().identity(Identity::from_pem(&pki.cert, &pki.key));
        tokio::spawn(
            tonic::transport::Server::builder()
                .tls_config(tls)
                .unwrap()
                .add_service(RegistryServer::new(fake))
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    let _ = stopped.await;
                }),
        );
        Self {
            addr,
            policy,
            calls,
            _stop: stop,
        }
    }

    /// `https://127.0.0.1:port`.
    fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    async fn next(&mut self) -> Call {
        tokio::time::timeout(PATIENCE, self.calls.recv())
            .await
            .expect("registry heard nothing in time")
            .expect("registry stopped")
    }

    /// The next heartbeat's token and arrival.
    async fn heartbeat(&mut self) -> (Option<String>, Instant) {
        match self.next().await {
            Call::Heartbeat { token, at } => (token, at),
            other => panic!("expected a heartbeat, got {other:?}"),
        }
    }

    /// Skips heartbeats until the deregistration.
    async fn deregistration(&mut self) -> (Option<String>, DeregisterRequest) {
        loop {
            if let Call::Deregister { token, request } = self.next().await {
                return (token, request);
            }
        }
    }
}

fn info() -> PluginInfo {
    PluginInfo::new("hello", ApiRef::new("example.com", "greetings", "v1"))
        .implementation("Hello")
        .address("127.0.0.1:50052")
}

/// Replaces the file at `path` in one step, as the kubelet does.
fn write_atomically(path: &Path, contents: &str) {
    let staged = path.with_extension("new");
    std::fs::write(&staged, contents).unwrap();
    std::fs::rename(&staged, path).unwrap();
}

fn refused(status: &Status) -> Option<(&str, &str)> {
    match &status.last {
        Some(Outcome::Refused { reason, message }) => Some((reason, message)),
        _ => None,
    }
}

#[tokio::test]
async fn tls_heartbeats_and_deregistration_carry_the_token() {
    let pki = pki();
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    // Trailing whitespace, as `kubectl create token > file` leaves it.
    std::fs::write(&token_file, "token-a\n").unwrap();
    let mut server = Server::start(&pki, Duration::from_secs(3600), &["token-a"]).await;
    // By name: the certificate must match the URL's host.
    let url = format!("https://localhost:{}", server.addr.port());
    let mut client = Client::start(
        Heartbeater::new(url, info())
            .registry_ca(pki.ca.clone())
            .token_file(&token_file),
    );

    assert_eq!(server.heartbeat().await.0.as_deref(), Some("token-a"));
    client.wait_accepted().await;

    client.stop().await;
    let (token, request) = server.deregistration().await;
    assert_eq!(token.as_deref(), Some("token-a"));
    assert_eq!(request.name, "hello");
}

#[tokio::test]
async fn a_rotated_token_is_read_afresh() {
    rotate_the_token(false).await;
}

/// As the kubelet rotates a projected token: the old one works until it
/// expires. A heartbeat stream opened with it is replaced all the same.
#[tokio::test]
async fn a_rotated_token_is_used_while_the_old_one_still_works() {
    rotate_the_token(true).await;
}

/// Heartbeats carry the token file's new token soon after it changes,
/// whether or not the old one still works.
async fn rotate_the_token(old_still_works: bool) {
    let pki = pki();
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    write_atomically(&token_file, "token-a");
    let mut server = Server::start(&pki, Duration::from_millis(100), &["token-a"]).await;
    let client = Client::start(
        Heartbeater::new(server.url(), info())
            .registry_ca(pki.ca.clone())
            .token_file(&token_file),
    );
    assert_eq!(server.heartbeat().await.0.as_deref(), Some("token-a"));
    assert_eq!(server.heartbeat().await.0.as_deref(), Some("token-a"));

    server.policy.lock().unwrap().tokens = if old_still_works {
        vec!["token-a".into(), "token-b".into()]
    } else {
        vec!["token-b".into()]
    };
    write_atomically(&token_file, "token-b");
    let mut seen = Vec::new();
    loop {
        let (token, _) = server.heartbeat().await;
        if token.as_deref() == Some("token-b") {
            break;
        }
        seen.push(token);
        // One heartbeat may have been on its way when the file changed.
        assert!(seen.len() < 3, "the new token never came: {seen:?}");
    }
    client.stop().await;
    assert_eq!(server.deregistration().await.0.as_deref(), Some("token-b"));
}

#[tokio::test]
async fn no_token_is_refused_and_retried_at_the_interval_until_it_appears() {
    let pki = pki();
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    let mut server = Server::start(&pki, Duration::from_secs(3600), &["token-a"]).await;
    // 600ms: the failure backoff would retry after 200ms, then 400ms.
    let interval = Duration::from_millis(600);
    let mut client = Client::start(
        Heartbeater::new(server.url(), info())
            .registry_ca(pki.ca.clone())
            .token_file(&token_file)
            .interval(interval),
    );

    let status = client.wait_status(|s| refused(s).is_some()).await;
    let (reason, message) = refused(&status).unwrap();
    assert_eq!(reason, "Unauthenticated");
    assert!(message.contains(NO_TOKEN), "{message}");
    assert_eq!(status.uid, None);
    assert_eq!(status.consecutive_failures, 0);

    let mut times = Vec::new();
    for _ in 0..3 {
        let (token, at) = server.heartbeat().await;
        assert_eq!(token, None, "there is no token file");
        times.push(at);
    }
    assert_gaps_at_least(&times, Duration::from_millis(530));

    // A wrong token is refused too, saying so.
    write_atomically(&token_file, "token-x");
    let status = client
        .wait_status(|s| refused(s).is_some_and(|(_, m)| m.contains("invalid bearer token")))
        .await;
    assert_eq!(refused(&status).unwrap().0, "Unauthenticated");

    // The right one lets the plugin in without a restart.
    write_atomically(&token_file, "token-a");
    client.wait_accepted().await;
    client.stop().await;
}

#[tokio::test]
async fn permission_denied_is_retried_at_the_interval() {
    let pki = pki();
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "token-a").unwrap();
    let mut server = Server::start(&pki, Duration::from_secs(3600), &["token-a"]).await;
    server.policy.lock().unwrap().deny = 3;
    let interval = Duration::from_millis(600);
    let mut client = Client::start(
        Heartbeater::new(server.url(), info())
            .registry_ca(pki.ca.clone())
            .token_file(&token_file)
            .interval(interval),
    );

    let status = client.wait_status(|s| refused(s).is_some()).await;
    assert_eq!(
        refused(&status),
        Some((
            "PermissionDenied",
            "system:serviceaccount:plugins:hello may not create plugins/heartbeat \"hello\""
        ))
    );
    assert_eq!(status.uid, None);
    assert_eq!(status.consecutive_failures, 0);

    // Three refusals, then the accepted fourth heartbeat.
    let mut times = Vec::new();
    for _ in 0..4 {
        times.push(server.heartbeat().await.1);
    }
    assert_gaps_at_least(&times, Duration::from_millis(530));
    client.wait_accepted().await;
    client.stop().await;
}

#[tokio::test]
async fn an_untrusted_certificate_is_a_failure() {
    let server_pki = pki();
    let other_ca = pki().ca;
    let mut server = Server::start(&server_pki, Duration::from_secs(3600), &[]).await;
    let mut client =
        Client::start(Heartbeater::new(server.url(), info()).registry_ca(other_ca.clone()));

    let status = client.wait_status(|s| s.consecutive_failures >= 2).await;
    match &status.last {
        Some(Outcome::Failed { code, message }) => {
            assert_eq!(*code, Code::Unavailable);
            assert!(message.contains("certificate"), "{message}");
        }
        other => panic!("expected a failure, got {other:?}"),
    }
    client.stop().await;
    assert!(
        server.calls.try_recv().is_err(),
        "no call may pass an unverified connection"
    );
}

#[tokio::test]
async fn https_without_a_ca_fails_at_start() {
    let result = tokio::time::timeout(
        PATIENCE,
        Heartbeater::new("https://kplug.kplug-system.svc:8444", info())
            .token_file("/nonexistent")
            .run(std::future::pending()),
    )
    .await
    .expect("run should fail at once");
    match result {
        Err(Error::RegistryTls { reason, .. }) => {
            assert!(reason.contains("--registry-ca-file"), "{reason}");
        }
        other => panic!("expected a TLS error, got {other:?}"),
    }

    let config = || {
        Config::default()
            .registry("https://kplug.kplug-system.svc:8444")
            .listen("127.0.0.1:0".parse().unwrap())
    };
    let error = bind(config()).await.unwrap_err();
    assert!(
        matches!(error, Error::RegistryTls { .. }),
        "expected a TLS error, got {error:?}"
    );
    assert!(
        error.to_string().contains("KPLUG_REGISTRY_CA_FILE"),
        "{error}"
    );

    let missing = PathBuf::from("/nonexistent/ca.crt");
    let error = bind(config().registry_ca_file(&missing)).await.unwrap_err();
    match error {
        Error::ReadRegistryCa { path, .. } => assert_eq!(path, missing),
        other => panic!("expected a CA file error, got {other:?}"),
    }

    let dir = tempfile::tempdir().unwrap();
    let not_pem = dir.path().join("ca.crt");
    std::fs::write(&not_pem, "hello").unwrap();
    let error = bind(config().registry_ca_file(&not_pem)).await.unwrap_err();
    assert!(
        matches!(error, Error::RegistryTls { ref reason, .. } if reason.contains("no PEM certificate")),
        "{error:?}"
    );
}

/// A plugin with nothing to do, for the end-to-end tests.
struct Idle;

impl Plugin for Idle {
    async fn reconcile(&self, _: Request) -> kplug_sdk::Outcome {
        kplug_sdk::Outcome::success()
    }

    async fn finalize(&self, _: Request) -> kplug_sdk::Outcome {
        kplug_sdk::Outcome::success()
    }
}

async fn bind(config: Config) -> Result<kplug_sdk::Server<Idle>, Error> {
    kplug_sdk::Server::bind(Idle, info(), config).await
}

#[tokio::test]
async fn serve_uses_the_config_options() {
    let pki = pki();
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&token_file, "token-a").unwrap();
    std::fs::write(&ca_file, &pki.ca).unwrap();
    let mut server = Server::start(&pki, Duration::from_secs(3600), &["token-a"]).await;
    let config = Config::default()
        .registry(server.url())
        .listen("127.0.0.1:0".parse().unwrap())
        .token_file(&token_file)
        .registry_ca_file(&ca_file);

    let plugin = kplug_sdk::Server::bind(Idle, info(), config).await.unwrap();
    let mut status = plugin.heartbeat_status();
    let (stop, stopped) = oneshot::channel::<()>();
    let running = tokio::spawn(plugin.run(async {
        let _ = stopped.await;
    }));
    assert_eq!(server.heartbeat().await.0.as_deref(), Some("token-a"));
    tokio::time::timeout(PATIENCE, status.wait_for(|s| s.uid.is_some()))
        .await
        .expect("never registered")
        .unwrap();

    stop.send(()).unwrap();
    tokio::time::timeout(PATIENCE, running)
        .await
        .expect("shutdown hung")
        .unwrap()
        .unwrap();
    assert_eq!(server.deregistration().await.0.as_deref(), Some("token-a"));
}
