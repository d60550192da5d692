//! kplug-cluster-dns against a real kube-apiserver (hack/control-plane.sh):
//! its answers follow Services and Endpoints as they are created, changed
//! and deleted; names outside the domain are refused and nothing is
//! forwarded; glibc's resolver, configured as a pod's, finds Services
//! through the search list. And with no kube-apiserver to list from, it
//! answers SERVFAIL in the domain and still refuses the rest.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;
use kplug_test_support::ControlPlane;
use support::{Dns, DnsServer, Reply, Transport, Upstream, private_loopback};

const KUBERNETES: &str = "kubernetes.default.svc.cluster.local.";

/// `getent ARGS` as a pod would resolve: in a mount namespace of its own
/// whose /etc/resolv.conf is `resolv_conf`. Returns (exit code, stdout).
fn getent_in_pod(resolv_conf: &Path, args: &[&str]) -> (i32, String, Duration) {
    let start = Instant::now();
    let output = Command::new("unshare")
        .args([
            "--mount",
            "sh",
            "-c",
            r#"mount --bind "$RESOLV_CONF" /etc/resolv.conf && exec getent "$@""#,
            "sh",
        ])
        .args(args)
        .env("RESOLV_CONF", resolv_conf)
        .output()
        .expect("run unshare (util-linux)");
    let elapsed = start.elapsed();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !stderr.contains("mount:") && !stderr.contains("unshare:"),
        "cannot give getent a resolv.conf of its own: {stderr}"
    );
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        elapsed,
    )
}

/// `kubectl apply`; returns when it started.
fn apply(cluster: &ControlPlane, yaml: &str) -> Instant {
    let start = Instant::now();
    cluster.apply(yaml);
    start
}

fn ms(d: Duration) -> u128 {
    d.as_millis()
}

fn refused(reply: &Reply) -> bool {
    reply.rcode == ResponseCode::Refused && reply.answers.is_empty() && !reply.recursion_available
}

#[test]
fn answers_follow_services_and_endpoints_and_nothing_else_is_answered() {
    let work = tempfile::tempdir().expect("a temporary directory");
    let cluster = ControlPlane::start(work.path().join("cp"));

    // What a forwarding server would send other names to: its own
    // resolv.conf names this upstream, which counts what reaches it.
    let upstream = Upstream::start((private_loopback(54), 53).into());
    let server_resolv = work.path().join("server-resolv.conf");
    std::fs::write(
        &server_resolv,
        format!("nameserver {}\n", upstream.addr.ip()),
    )
    .expect("write the server's resolv.conf");

    // A pod's resolv.conf (what the kubelet writes with clusterDNS), with
    // the server on port 53 of an address of this run's own.
    let pod_dns = private_loopback(53);
    let pod_resolv = work.path().join("pod-resolv.conf");
    std::fs::write(
        &pod_resolv,
        format!(
            "nameserver {pod_dns}\nsearch default.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n"
        ),
    )
    .expect("write the pod's resolv.conf");

    let kubeconfig = cluster.kubeconfig();
    let pod_listen = format!("{pod_dns}:53");
    let started = Instant::now();
    let server = DnsServer::start(
        &[
            "--kubeconfig",
            &kubeconfig.to_string_lossy(),
            "--listen",
            "127.0.0.1:0",
            "--listen",
            &pod_listen,
            "--ttl",
            "1",
        ],
        Some(&server_resolv),
    );
    let dns = Dns::new(server.addr);

    // Ready: the `kubernetes` Service (the first IP of the control plane's
    // service range) is answered once Services and Endpoints are listed.
    dns.wait_records(KUBERNETES, RecordType::A, &["A 10.0.0.1"]);
    let ready = started.elapsed();
    server
        .stderr
        .wait_for(Duration::from_secs(5), "the synced log line", |l| {
            l.contains("synced: answering for cluster.local.")
        });
    for transport in [Transport::Udp, Transport::Tcp, Transport::UdpNoEdns] {
        let reply = dns.ask_over(KUBERNETES, RecordType::A, transport);
        assert_eq!(reply.answers, ["A 10.0.0.1"], "{transport:?}");
        assert!(
            reply.authoritative && !reply.recursion_available,
            "{reply:?}"
        );
    }
    // NODATA for a type the name has not, with the SOA; NXDOMAIN (with
    // the SOA) for a name in the domain that does not exist.
    let aaaa = dns.ask(KUBERNETES, RecordType::AAAA);
    assert_eq!(
        (aaaa.rcode, aaaa.answers.len(), aaaa.authority.clone()),
        (ResponseCode::NoError, 0, vec![RecordType::SOA]),
        "{aaaa:?}"
    );
    let missing = dns.ask("nope.default.svc.cluster.local.", RecordType::A);
    assert_eq!(
        (missing.rcode, missing.authority.clone()),
        (ResponseCode::NXDomain, vec![RecordType::SOA]),
        "{missing:?}"
    );

    // Names outside the domain: REFUSED at once, over UDP and TCP.
    for (name, qtype) in [
        ("example.com.", RecordType::A),
        ("example.com.", RecordType::AAAA),
        (
            "kubernetes.default.svc.cluster.local.example.com.",
            RecordType::A,
        ),
        ("1.0.0.10.in-addr.arpa.", RecordType::PTR),
        (".", RecordType::NS),
    ] {
        for transport in [Transport::Udp, Transport::Tcp] {
            let reply = dns.ask_over(name, qtype, transport);
            assert!(refused(&reply), "{name} {qtype} {transport:?}: {reply:?}");
        }
    }

    // A ClusterIP Service: its cluster IP, with or without Endpoints.
    let applied = apply(
        &cluster,
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\nspec: {clusterIP: 10.0.0.50, ports: [{port: 80}]}\n",
    );
    dns.wait_records(
        "web.default.svc.cluster.local.",
        RecordType::A,
        &["A 10.0.0.50"],
    );
    let create_seen = applied.elapsed();

    // A headless Service: one record per ready address, and a name for
    // each; a not-ready address is not served.
    apply(
        &cluster,
        "apiVersion: v1\nkind: Service\nmetadata: {name: db, namespace: default}\nspec: {clusterIP: None, ports: [{port: 5432}]}\n",
    );
    let applied = apply(
        &cluster,
        "apiVersion: v1\nkind: Endpoints\nmetadata: {name: db, namespace: default}\nsubsets:\n- addresses: [{ip: 10.244.0.10, hostname: db-0}, {ip: 10.244.0.11, hostname: db-1}]\n  notReadyAddresses: [{ip: 10.244.0.12, hostname: db-2}]\n  ports: [{port: 5432}]\n",
    );
    dns.wait_records(
        "db.default.svc.cluster.local.",
        RecordType::A,
        &["A 10.244.0.10", "A 10.244.0.11"],
    );
    let endpoints_seen = applied.elapsed();
    assert_eq!(
        dns.ask("db-0.db.default.svc.cluster.local.", RecordType::A)
            .answers,
        ["A 10.244.0.10"]
    );
    assert_eq!(
        dns.ask("db-2.db.default.svc.cluster.local.", RecordType::A)
            .rcode,
        ResponseCode::NXDomain
    );

    // The Endpoints change: db-0 goes, db-2 becomes ready.
    let applied = apply(
        &cluster,
        "apiVersion: v1\nkind: Endpoints\nmetadata: {name: db, namespace: default}\nsubsets:\n- addresses: [{ip: 10.244.0.11, hostname: db-1}, {ip: 10.244.0.12, hostname: db-2}]\n  ports: [{port: 5432}]\n",
    );
    dns.wait_records(
        "db.default.svc.cluster.local.",
        RecordType::A,
        &["A 10.244.0.11", "A 10.244.0.12"],
    );
    let update_seen = applied.elapsed();
    assert_eq!(
        dns.ask("db-2.db.default.svc.cluster.local.", RecordType::A)
            .answers,
        ["A 10.244.0.12"]
    );
    dns.wait_nxdomain("db-0.db.default.svc.cluster.local.");

    // ExternalName Services: a CNAME, followed inside the domain.
    apply(
        &cluster,
        "apiVersion: v1\nkind: Service\nmetadata: {name: alias, namespace: default}\nspec: {type: ExternalName, externalName: web.default.svc.cluster.local}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: outside, namespace: default}\nspec: {type: ExternalName, externalName: www.example.com}\n",
    );
    dns.wait_records(
        "alias.default.svc.cluster.local.",
        RecordType::A,
        &["A 10.0.0.50", "CNAME web.default.svc.cluster.local."],
    );
    dns.wait_records(
        "outside.default.svc.cluster.local.",
        RecordType::A,
        &["CNAME www.example.com."],
    );

    // A big headless Service: more than fits in 512 bytes, so UDP without
    // EDNS is truncated and TCP has all of it.
    let many: Vec<String> = (1..=100).map(|i| format!("{{ip: 10.244.1.{i}}}")).collect();
    apply(
        &cluster,
        &format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: many, namespace: default}}\nspec: {{clusterIP: None, ports: [{{port: 80}}]}}\n---\napiVersion: v1\nkind: Endpoints\nmetadata: {{name: many, namespace: default}}\nsubsets:\n- addresses: [{}]\n  ports: [{{port: 80}}]\n",
            many.join(", ")
        ),
    );
    dns.wait_for(
        "10-244-1-100.many.default.svc.cluster.local.",
        RecordType::A,
        Duration::from_secs(15),
        |r| r.answers == ["A 10.244.1.100"],
    );
    let full = dns.ask_over(
        "many.default.svc.cluster.local.",
        RecordType::A,
        Transport::Tcp,
    );
    assert_eq!(
        (full.rcode, full.answers.len(), full.truncated),
        (ResponseCode::NoError, 100, false)
    );
    let cut = dns.ask_over(
        "many.default.svc.cluster.local.",
        RecordType::A,
        Transport::UdpNoEdns,
    );
    assert!(
        cut.truncated && cut.answers.len() < 100,
        "UDP without EDNS: {} answers, truncated {}",
        cut.answers.len(),
        cut.truncated
    );

    // glibc's resolver with a pod's resolv.conf: short names through the
    // search list (and A and AAAA both asked), other names fail at once.
    let (code, out, _) = getent_in_pod(&pod_resolv, &["ahosts", "web"]);
    assert_eq!(code, 0, "getent ahosts web: {out}");
    assert!(
        out.lines().next().is_some_and(
            |l| l.starts_with("10.0.0.50 ") && l.ends_with("web.default.svc.cluster.local")
        ),
        "getent ahosts web: {out}"
    );
    let (code, out, _) = getent_in_pod(&pod_resolv, &["hosts", "db-1.db"]);
    assert_eq!(
        (code, out.split_whitespace().next()),
        (0, Some("10.244.0.11")),
        "getent hosts db-1.db: {out}"
    );
    let (code, out, _) = getent_in_pod(&pod_resolv, &["hosts", "kubernetes.default"]);
    assert_eq!(
        (code, out.split_whitespace().next()),
        (0, Some("10.0.0.1")),
        "getent hosts kubernetes.default: {out}"
    );
    // Not found (exit 2), and at once: REFUSED, not a timeout (glibc
    // waits 5 s per try for a server that does not answer).
    let (code, out, took) = getent_in_pod(&pod_resolv, &["ahosts", "example.com"]);
    assert_eq!(code, 2, "getent ahosts example.com: {out}");
    assert!(took < Duration::from_secs(2), "example.com took {took:?}");

    // Deletions: the Service's name goes; the headless Service without
    // Endpoints has no name.
    let deleted = Instant::now();
    cluster.kubectl_ok(&["delete", "service", "web", "-n", "default"]);
    let kubectl_took = deleted.elapsed();
    dns.wait_nxdomain("web.default.svc.cluster.local.");
    let delete_seen = deleted.elapsed();
    cluster.kubectl_ok(&["delete", "endpoints", "db", "-n", "default"]);
    dns.wait_nxdomain("db.default.svc.cluster.local.");
    dns.wait_nxdomain("db-1.db.default.svc.cluster.local.");
    // The alias to the deleted Service: the CNAME, then NXDOMAIN.
    let dangling = dns.ask("alias.default.svc.cluster.local.", RecordType::A);
    assert_eq!(
        (dangling.rcode, dangling.answers),
        (
            ResponseCode::NXDomain,
            vec!["CNAME web.default.svc.cluster.local.".to_owned()]
        )
    );

    // Latency of answers on loopback, one query at a time over UDP.
    let mut took: Vec<Duration> = (0..1000)
        .map(|_| {
            let start = Instant::now();
            let reply = dns.ask(KUBERNETES, RecordType::A);
            assert_eq!(reply.answers, ["A 10.0.0.1"]);
            start.elapsed()
        })
        .collect();
    took.sort();
    let p50 = took[took.len() / 2];
    let p99 = took[took.len() * 99 / 100];

    // Nothing of all that was forwarded, and the server is still up.
    assert_eq!(
        upstream.received(),
        0,
        "the server sent something to the upstream in its resolv.conf"
    );
    assert!(
        matches!(dns.try_ask(KUBERNETES, RecordType::A, Transport::Tcp), Ok(r) if r.answers == ["A 10.0.0.1"])
    );
    let rss = server.rss_kib();
    eprintln!(
        "cluster-dns measured: ready {} ms after start; a change answered {} ms (Service \
         created), {} ms (Endpoints created), {} ms (Endpoints changed), {} ms (Service \
         deleted) after kubectl started (kubectl delete itself took {} ms); \
         query over loopback UDP (fresh client each): p50 {:?}, p99 {:?}; RSS {} KiB",
        ms(ready),
        ms(create_seen),
        ms(endpoints_seen),
        ms(update_seen),
        ms(delete_seen),
        ms(kubectl_took),
        p50,
        p99,
        rss
    );

    server.stop();
}

#[test]
fn without_kube_apiserver_it_answers_servfail_in_the_domain_and_refuses_the_rest() {
    let work = tempfile::tempdir().expect("a temporary directory");
    // A kube-apiserver address where nothing listens.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let kubeconfig = work.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: 'https://{closed}', insecure-skip-tls-verify: true}}\nusers:\n- name: u\n  user: {{token: t}}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\n"
        ),
    )
    .expect("write the kubeconfig");
    let server = DnsServer::start(
        &[
            "--kubeconfig",
            &kubeconfig.to_string_lossy(),
            "--listen",
            "127.0.0.1:0",
        ],
        None,
    );
    let dns = Dns::new(server.addr);
    server
        .stderr
        .wait_for(Duration::from_secs(10), "a failed watch in the log", |l| {
            l.contains("failed; retrying")
        });
    for transport in [Transport::Udp, Transport::Tcp] {
        let reply = dns.ask_over(KUBERNETES, RecordType::A, transport);
        assert_eq!(
            (reply.rcode, reply.answers.len()),
            (ResponseCode::ServFail, 0),
            "{transport:?}: {reply:?}"
        );
        let reply = dns.ask_over("example.com.", RecordType::A, transport);
        assert!(refused(&reply), "{transport:?}: {reply:?}");
    }
    server.stop();
}

#[test]
fn bad_flags_and_a_busy_port_stop_it_with_a_message() {
    let binary = env!("CARGO_BIN_EXE_kplug-cluster-dns");
    let output = Command::new(binary)
        .output()
        .expect("run kplug-cluster-dns");
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--listen"));

    let busy = std::net::UdpSocket::bind("127.0.0.1:0").expect("a UDP socket");
    let port = busy.local_addr().expect("its address").port();
    let work = tempfile::tempdir().expect("a temporary directory");
    let kubeconfig = work.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:1'}\nusers:\n- name: u\n  user: {}\ncontexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\n",
    )
    .expect("write the kubeconfig");
    let output = Command::new(binary)
        .args(["--kubeconfig", &kubeconfig.to_string_lossy()])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .output()
        .expect("run kplug-cluster-dns");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot listen on udp 127.0.0.1:{port}")),
        "{stderr}"
    );

    let output = Command::new(binary)
        .args(["--listen", "127.0.0.1:0", "--domain", "bad..domain"])
        .output()
        .expect("run kplug-cluster-dns");
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--domain"));
}
