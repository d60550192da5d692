//! Heartbeating to every kplug replica: a registry host name that resolves
//! to several addresses gets heartbeats at each, followed as the answer
//! changes, and drained and deregistered at each on shutdown.
//!
//! The replicas are real fake registries on 127.0.0.1 and 127.0.0.2 with
//! the same port (Linux routes all of 127/8 to loopback), as the pods of a
//! headless Service share theirs. The name is resolved by a resolver of the
//! test's own, as no name on the machine resolves to both and the hosts
//! file is not the tests' to edit; the system resolver is covered by the
//! `https://localhost` tests in cluster.rs and the unit tests.

mod fake;

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kplug_sdk::heartbeat::{Heartbeats, Outcome, Resolve};
use kplug_sdk::{ApiRef, Heartbeater, PluginInfo, Status};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::Code;

use fake::{Options, PATIENCE, Registry};

const NAME: &str = "kplug.test";

/// The answer the test's resolver gives for [`NAME`]: addresses, or a
/// failure for `None`.
#[derive(Clone, Default)]
struct Dns(Arc<Mutex<Option<Vec<SocketAddr>>>>);

impl Dns {
    fn answering(addresses: &[SocketAddr]) -> Self {
        let dns = Self::default();
        dns.set(addresses);
        dns
    }

    fn set(&self, addresses: &[SocketAddr]) {
        *self.0.lock().unwrap() = Some(addresses.to_vec());
    }

    fn resolver(&self) -> impl Resolve {
        let answer = Arc::clone(&self.0);
        move |host: &str, _port: u16| {
            let answer = answer.lock().unwrap().clone().filter(|_| host == NAME);
            std::future::ready(answer.ok_or_else(|| io::Error::other("no such host")))
        }
    }
}

/// Two listeners with the same port, on 127.0.0.1 and 127.0.0.2.
async fn listener_pair() -> (TcpListener, TcpListener) {
    for _ in 0..20 {
        let first = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = first.local_addr().unwrap().port();
        if let Ok(second) = TcpListener::bind(("127.0.0.2", port)).await {
            return (first, second);
        }
    }
    panic!("no port is free on both 127.0.0.1 and 127.0.0.2");
}

/// Two fake registries, one per replica, with a 100ms interval.
async fn replicas(instances: [bool; 2]) -> (Registry, Registry) {
    let (first, second) = listener_pair().await;
    let options = |instances| Options {
        interval: Duration::from_millis(100),
        instances,
        ..Options::default()
    };
    (
        Registry::serve(first, options(instances[0])).await,
        Registry::serve(second, options(instances[1])).await,
    )
}

fn info() -> PluginInfo {
    PluginInfo::new("hello", ApiRef::new("example.com", "greetings", "v1"))
        .implementation("Hello")
        .address("10.0.0.9:50052")
}

/// Heartbeats to [`NAME`] at `port`, resolved by `dns` every 100ms.
fn heartbeater(scheme: &str, port: u16, dns: &Dns) -> Heartbeater {
    Heartbeater::new(format!("{scheme}://{NAME}:{port}"), info())
        .instance("hello-7d9f-x2x")
        .resolver(dns.resolver())
        .resolve_interval(Duration::from_millis(100))
}

async fn wait(status: &mut watch::Receiver<Status>, what: impl FnMut(&Status) -> bool) -> Status {
    tokio::time::timeout(PATIENCE, status.wait_for(what))
        .await
        .expect("the status never matched")
        .expect("the heartbeats ended")
        .clone()
}

fn addresses(status: &Status) -> Vec<SocketAddr> {
    status.replicas.iter().map(|r| r.address).collect()
}

async fn stop(heartbeats: Heartbeats) {
    tokio::time::timeout(PATIENCE, heartbeats.stop())
        .await
        .expect("stopping hung")
        .expect("the heartbeats ended abnormally");
}

#[tokio::test]
async fn every_replica_gets_heartbeats_and_one_going_away_leaves_the_other() {
    let (mut a, mut b) = replicas([true, true]).await;
    let dns = Dns::answering(&[a.addr, b.addr]);
    let heartbeats = heartbeater("http", a.addr.port(), &dns).start().unwrap();
    let mut status = heartbeats.status();

    for replica in [&mut a, &mut b] {
        let (request, _) = replica.heartbeat().await;
        assert_eq!(request.instance, "hello-7d9f-x2x");
        assert_eq!(request.address, "10.0.0.9:50052");
        assert!(!request.draining);
    }
    let both = wait(&mut status, |s| s.accepted_by() == 2).await;
    assert_eq!(addresses(&both), [a.addr, b.addr]);
    assert_eq!(both.uid.as_deref(), Some("uid-1"));

    // One replica goes away, still resolved: its heartbeats fail, the
    // other's go on, and the plugin stays registered.
    drop(b);
    let one = wait(&mut status, |s| {
        matches!(
            s.replicas.get(1).and_then(|r| r.last.as_ref()),
            Some(Outcome::Failed { .. })
        )
    })
    .await;
    assert_eq!(one.last, Some(Outcome::Accepted));
    assert_eq!(one.uid.as_deref(), Some("uid-1"));
    assert_eq!(one.accepted_by(), 1);
    assert_eq!(one.consecutive_failures, 0);
    let (_, mut previous) = a.heartbeat().await;
    for _ in 0..3 {
        let (_, at) = a.heartbeat().await;
        // At the interval (100ms - 10% jitter), not faster.
        assert!(at - previous >= Duration::from_millis(85));
        previous = at;
    }

    stop(heartbeats).await;
    let (request, _) = a.deregistration().await;
    assert_eq!(request.instance, "hello-7d9f-x2x");
    assert_eq!(request.address, "10.0.0.9:50052");
}

#[tokio::test]
async fn follows_the_replicas_the_name_resolves_to() {
    let (mut a, mut b) = replicas([true, true]).await;
    let dns = Dns::answering(&[a.addr]);
    let heartbeats = heartbeater("http", a.addr.port(), &dns).start().unwrap();
    let mut status = heartbeats.status();
    a.heartbeat().await;
    wait(&mut status, |s| s.accepted_by() == 1).await;
    b.assert_quiet();

    // A replica appears: it gets heartbeats too.
    dns.set(&[a.addr, b.addr]);
    assert_eq!(b.heartbeat().await.0.instance, "hello-7d9f-x2x");
    wait(&mut status, |s| s.accepted_by() == 2).await;

    // The first one vanishes from the answer: its heartbeats stop, without
    // a deregistration, while the other's go on.
    dns.set(&[b.addr]);
    let left = wait(&mut status, |s| s.replicas.len() == 1).await;
    assert_eq!(addresses(&left), [b.addr]);
    for _ in 0..3 {
        b.heartbeat().await;
    }
    // Heartbeats sent before the session ended may still come in.
    while let Some(call) = a.try_next() {
        assert!(matches!(call, fake::Call::Heartbeat(..)), "{call:?}");
    }
    for _ in 0..3 {
        b.heartbeat().await;
    }
    a.assert_quiet();

    stop(heartbeats).await;
    b.deregistration().await;
    a.assert_quiet();
}

#[tokio::test]
async fn a_name_that_does_not_resolve_fails_until_it_does() {
    let (mut a, _b) = replicas([true, true]).await;
    let dns = Dns::default();
    let heartbeats = heartbeater("http", a.addr.port(), &dns).start().unwrap();
    let mut status = heartbeats.status();

    let failing = wait(&mut status, |s| s.consecutive_failures >= 2).await;
    match &failing.last {
        Some(Outcome::Failed { code, message }) => {
            assert_eq!(*code, Code::Unavailable);
            assert!(message.contains("cannot resolve kplug.test"), "{message}");
        }
        other => panic!("expected a failure, got {other:?}"),
    }
    assert!(failing.replicas.is_empty());
    assert_eq!(failing.uid, None);

    // Retried with the failure backoff, not the 100ms resolve interval
    // alone: the name resolving is noticed.
    dns.set(&[a.addr]);
    a.heartbeat().await;
    let registered = wait(&mut status, |s| s.last == Some(Outcome::Accepted)).await;
    assert_eq!(registered.consecutive_failures, 0);
    stop(heartbeats).await;
}

/// A CA, and a serving certificate of it for [`NAME`] only: no IP address.
fn pki() -> (String, String, String) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec![NAME.to_owned()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    (ca.pem(), cert.pem(), key.serialize_pem())
}

#[tokio::test]
async fn tls_verifies_the_name_while_dialing_each_address() {
    let (ca, cert, key) = pki();
    let (first, second) = listener_pair().await;
    let options = || Options {
        tls: Some((cert.clone(), key.clone())),
        ..Options::default()
    };
    let mut a = Registry::serve(first, options()).await;
    let mut b = Registry::serve(second, options()).await;
    let dns = Dns::answering(&[a.addr, b.addr]);
    // The certificate names neither 127.0.0.1 nor 127.0.0.2: only checking
    // it against the name given lets these heartbeats through.
    let heartbeats = heartbeater("https", a.addr.port(), &dns)
        .registry_ca(ca)
        .start()
        .unwrap();
    let mut status = heartbeats.status();
    a.heartbeat().await;
    b.heartbeat().await;
    wait(&mut status, |s| s.accepted_by() == 2).await;
    stop(heartbeats).await;
}

#[tokio::test]
async fn drain_tells_every_replica_and_stop_deregisters_from_each() {
    // The first replica knows instances; the second is a kplug from before
    // them, which would ignore `draining`.
    let (mut a, mut b) = replicas([true, false]).await;
    let dns = Dns::answering(&[a.addr, b.addr]);
    let mut heartbeats = heartbeater("http", a.addr.port(), &dns).start().unwrap();
    let mut status = heartbeats.status();
    let known = wait(&mut status, |s| s.accepted_by() == 2).await;
    assert_eq!(
        known
            .replicas
            .iter()
            .map(|r| r.instances)
            .collect::<Vec<_>>(),
        [true, false]
    );

    let started = Instant::now();
    tokio::time::timeout(PATIENCE, heartbeats.drain())
        .await
        .expect("drain hung");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "drain waited for its time limit"
    );
    // By the time drain returns, each replica has been told: the first by
    // a draining heartbeat, the second by the deregistration.
    let (draining, _) = a.draining_heartbeat().await;
    assert_eq!(draining.instance, "hello-7d9f-x2x");
    let (deregistered, _) = b.deregistration().await;
    assert_eq!(deregistered.instance, "hello-7d9f-x2x");
    let drained = status.borrow().clone();
    assert!(drained.draining);
    assert!(drained.replicas.iter().all(|r| r.drain_notified));

    stop(heartbeats).await;
    let (deregistered, _) = a.deregistration_after_draining().await;
    assert_eq!(deregistered.instance, "hello-7d9f-x2x");
    // Deregistered once only.
    b.assert_quiet();
}

#[tokio::test]
async fn drain_is_bounded_when_kplug_does_not_answer() {
    // Accepts connections but never speaks HTTP/2, like a wedged kplug.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (first_connection, _hold) = fake::wedged(listener);
    let mut heartbeats = Heartbeater::new(format!("http://{addr}"), info())
        .start()
        .unwrap();
    tokio::time::timeout(PATIENCE, first_connection)
        .await
        .expect("the heartbeats connect")
        .expect("the listener runs");

    let started = Instant::now();
    heartbeats.drain().await;
    let drained = started.elapsed();
    // DRAIN_NOTICE_TIMEOUT, with slack for a loaded machine.
    assert!(drained < Duration::from_secs(4), "drain took {drained:?}");
    let started = Instant::now();
    stop(heartbeats).await;
    let stopped = started.elapsed();
    assert!(stopped < Duration::from_secs(4), "stop took {stopped:?}");
}
