//! kplug as a real aggregated API server: a real kube-apiserver and etcd
//! (hack/control-plane.sh), the shipped RBAC (deploy/) and APIService
//! (apiservice/), kplug in cluster mode running as its own ServiceAccount,
//! and plugins heartbeating with ServiceAccount tokens.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use common::postgres::{Postgres, venv_python};
use common::{KUBECTL, Lines, Process, free_port, repo_root, workspace_binary};
use serde_json::{Value, json};

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// etcd and kube-apiserver from `hack/control-plane.sh`, stopped on drop.
struct ControlPlane {
    dir: PathBuf,
    env: HashMap<String, String>,
}

impl ControlPlane {
    fn start(dir: PathBuf) -> Self {
        let status = Command::new(repo_root().join("hack/control-plane.sh"))
            .arg("start")
            .arg(&dir)
            .stdout(Stdio::null())
            .status()
            .expect("run hack/control-plane.sh");
        assert!(status.success(), "the control plane did not start");
        let env = std::fs::read_to_string(dir.join("env"))
            .expect("control plane env")
            .lines()
            .filter_map(|l| {
                let l = l.strip_prefix("export ").unwrap_or(l);
                let (k, v) = l.split_once('=')?;
                Some((
                    k.to_owned(),
                    v.trim_matches(|c| c == '"' || c == '\'').to_owned(),
                ))
            })
            .collect();
        Self { dir, env }
    }

    fn var(&self, name: &str) -> String {
        self.env
            .get(name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} missing from the control plane env"))
    }

    fn kubectl(&self, args: &[&str]) -> Output {
        Command::new(KUBECTL)
            .arg("--kubeconfig")
            .arg(self.var("KPLUG_KUBECONFIG"))
            .args(args)
            .output()
            .expect("run kubectl")
    }

    fn kubectl_ok(&self, args: &[&str]) -> String {
        let output = self.kubectl(args);
        assert!(
            output.status.success(),
            "kubectl {args:?}: {}",
            text(&output)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    fn apply(&self, yaml: &str) {
        let file = self.dir.join(format!("apply-{}.yaml", free_port()));
        std::fs::write(&file, yaml).expect("write manifest");
        self.kubectl_ok(&["apply", "-f", &file.to_string_lossy()]);
    }

    /// A ServiceAccount token from the TokenRequest API.
    fn token(&self, namespace: &str, service_account: &str) -> String {
        let request = self.dir.join("token-request.json");
        std::fs::write(
            &request,
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}}).to_string(),
        )
        .expect("write TokenRequest");
        let path =
            format!("/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token");
        let answer: Value = serde_json::from_str(&self.kubectl_ok(&[
            "create",
            "--raw",
            &path,
            "-f",
            &request.to_string_lossy(),
        ]))
        .expect("TokenRequest answer");
        answer["status"]["token"]
            .as_str()
            .expect("a token")
            .to_owned()
    }

    fn service_account_with_role(&self, name: &str, heartbeat_as: Option<&str>) {
        self.kubectl_ok(&["create", "serviceaccount", name, "-n", "plugins"]);
        if let Some(plugin) = heartbeat_as {
            self.apply(&format!(
                "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {{name: 'kplug:plugin:{name}'}}\nrules:\n- {{apiGroups: [plugins.kplug.io], resources: [plugins/heartbeat], verbs: [create], resourceNames: [{plugin}]}}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {{name: 'kplug:plugin:{name}'}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: 'kplug:plugin:{name}'}}\nsubjects:\n- {{kind: ServiceAccount, name: {name}, namespace: plugins}}\n"
            ));
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = Command::new(repo_root().join("hack/control-plane.sh"))
            .arg("stop")
            .arg(&self.dir)
            .status();
    }
}

/// kplug in cluster mode.
struct Kplug {
    _process: Process,
    log: Lines,
    https: u16,
    grpc: u16,
    certs: PathBuf,
}

impl Kplug {
    fn start(cluster: &ControlPlane, kubeconfig: &Path, certs: &Path) -> Self {
        let (https, grpc) = (free_port(), free_port());
        let mut child = Command::new(env!("CARGO_BIN_EXE_kplug-apiserver"))
            .args([
                "serve",
                "--listen",
                &format!("127.0.0.1:{https}"),
                "--grpc-listen",
                &format!("127.0.0.1:{grpc}"),
            ])
            .arg("--tls-cert-file")
            .arg(certs.join("tls.crt"))
            .arg("--tls-private-key-file")
            .arg(certs.join("tls.key"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args([
                "--authentication-cache-ttl",
                "1s",
                "--authorization-allowed-cache-ttl",
                "1s",
                "--authorization-denied-cache-ttl",
                "1s",
            ])
            .args([
                "--cert-reload-interval",
                "1s",
                "--min-heartbeat-interval",
                "1s",
                "--log",
                "info,kplug_apiserver::auth=debug",
            ])
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start kplug-apiserver serve");
        let log = Lines::new_stderr(child.stderr.take().expect("stderr"));
        log.wait_for(Duration::from_secs(30), "kplug serving", |l| {
            l.contains("kplug is serving")
        });
        let _ = cluster;
        Self {
            _process: Process {
                child,
                name: "kplug".to_owned(),
            },
            log,
            https,
            grpc,
            certs: certs.to_owned(),
        }
    }

    /// curl straight to kplug (not through kube-apiserver).
    fn curl(&self, cert: Option<(&str, &str)>, headers: &[&str], path: &str) -> (i32, u16, String) {
        let mut command = Command::new("curl");
        command
            .args([
                "-sS",
                "--max-time",
                "10",
                "-w",
                "\n%{http_code}",
                "--cacert",
            ])
            .arg(self.certs.join("ca.crt"));
        if let Some((cert, key)) = cert {
            command.args(["--cert", cert, "--key", key]);
        }
        for header in headers {
            command.args(["-H", header]);
        }
        let output = command
            .arg(format!("https://localhost:{}{path}", self.https))
            .output()
            .expect("curl");
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let (body, code) = stdout.rsplit_once('\n').unwrap_or(("", &stdout));
        (
            output.status.code().unwrap_or(-1),
            code.trim().parse().unwrap_or(0),
            body.to_owned(),
        )
    }
}

fn wait_until(what: &str, within: Duration, mut check: impl FnMut() -> Result<(), String>) {
    let deadline = Instant::now() + within;
    loop {
        match check() {
            Ok(()) => return,
            Err(last) if Instant::now() > deadline => {
                panic!("{what} not reached within {within:?}: {last}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(250)),
        }
    }
}

fn hello_plugin(kplug: &Kplug, name: &str, token_file: &Path) -> Process {
    let child = Command::new(workspace_binary("hello-plugin"))
        .args([
            "--registry",
            &format!("https://localhost:{}", kplug.grpc),
            "--name",
            name,
        ])
        .args([
            "--address",
            &format!("127.0.0.1:{}", free_port()),
            "--interval",
            "1",
        ])
        .arg("--registry-ca-file")
        .arg(kplug.certs.join("ca.crt"))
        .arg("--token-file")
        .arg(token_file)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start hello-plugin");
    Process {
        child,
        name: name.to_owned(),
    }
}

/// Whether kplug has logged refusing the aggregator's OpenAPI download.
fn kplug_refused_openapi(kplug: &Kplug) -> bool {
    kplug
        .log
        .drain()
        .iter()
        .any(|l| l.contains("system:aggregator") && l.contains("/openapi"))
}

/// A ServiceAccount JWT signed with the cluster's key but expired an hour ago.
fn expired_token(cluster: &ControlPlane) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let header = URL_SAFE_NO_PAD.encode(json!({"alg": "RS256", "typ": "JWT"}).to_string());
    let claims = URL_SAFE_NO_PAD.encode(
        json!({
            "iss": cluster.var("KPLUG_SA_ISSUER"),
            "aud": [cluster.var("KPLUG_API_AUDIENCES")],
            "sub": "system:serviceaccount:plugins:hello-a",
            "iat": now - 7200, "nbf": now - 7200, "exp": now - 3600,
            "kubernetes.io": {"namespace": "plugins", "serviceaccount": {"name": "hello-a", "uid": "00000000-0000-0000-0000-000000000000"}},
        })
        .to_string(),
    );
    let signing_input = format!("{header}.{claims}");
    let mut sign = Command::new("openssl")
        .args([
            "dgst",
            "-sha256",
            "-sign",
            &cluster.var("KPLUG_SA_SIGNING_KEY"),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("openssl");
    use std::io::Write;
    sign.stdin
        .take()
        .expect("stdin")
        .write_all(signing_input.as_bytes())
        .expect("sign input");
    let signature = sign.wait_with_output().expect("openssl output").stdout;
    format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(signature))
}

/// A client certificate with `common_name`, signed by the CA in `ca_cert`/`ca_key`.
fn client_cert(dir: &Path, common_name: &str, ca_cert: &str, ca_key: &str) -> (String, String) {
    let key = dir.join(format!("{common_name}.key"));
    let csr = dir.join(format!("{common_name}.csr"));
    let cert = dir.join(format!("{common_name}.crt"));
    let ext = dir.join("client.ext");
    std::fs::write(&ext, "extendedKeyUsage=clientAuth\n").expect("ext file");
    let run = |args: &[&str]| {
        let output = Command::new("openssl")
            .args(args)
            .output()
            .expect("openssl");
        assert!(
            output.status.success(),
            "openssl {args:?}: {}",
            text(&output)
        );
    };
    let (key_s, csr_s, cert_s, ext_s) = (
        key.to_string_lossy(),
        csr.to_string_lossy(),
        cert.to_string_lossy(),
        ext.to_string_lossy(),
    );
    run(&[
        "req",
        "-new",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        &key_s,
        "-out",
        &csr_s,
        "-subj",
        &format!("/CN={common_name}"),
    ]);
    run(&[
        "x509",
        "-req",
        "-in",
        &csr_s,
        "-CA",
        ca_cert,
        "-CAkey",
        ca_key,
        "-CAcreateserial",
        "-out",
        &cert_s,
        "-days",
        "1",
        "-extfile",
        &ext_s,
    ]);
    (cert_s.into_owned(), key_s.into_owned())
}

#[test]
fn kplug_behind_a_real_kube_apiserver() {
    let work = tempfile::Builder::new()
        .prefix("kplug-cluster-")
        .tempdir_in("/tmp")
        .expect("temp dir");
    let cluster = ControlPlane::start(work.path().join("cp"));

    // The shipped RBAC and kplug's own identity.
    cluster.kubectl_ok(&["apply", "-k", &repo_root().join("deploy").to_string_lossy()]);
    let kplug_token = cluster.token("kplug-system", "kplug");
    let kubeconfig = work.path().join("kplug.kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: '{}', certificate-authority: '{}'}}\nusers:\n- name: kplug\n  user: {{token: '{kplug_token}'}}\ncontexts:\n- name: c\n  context: {{cluster: c, user: kplug}}\ncurrent-context: c\n",
            cluster.var("KPLUG_APISERVER_URL"),
            cluster.var("KPLUG_CA_CERT"),
        ),
    )
    .expect("write kplug's kubeconfig");

    let certs = work.path().join("kplug-certs");
    let output = Command::new(env!("CARGO_BIN_EXE_kplug-apiserver"))
        .args([
            "certs",
            "--service",
            "kplug",
            "--namespace",
            "kplug-system",
            "--out-dir",
        ])
        .arg(&certs)
        .output()
        .expect("kplug-apiserver certs");
    assert!(output.status.success(), "{}", text(&output));
    assert!(
        !String::from_utf8_lossy(&output.stdout).trim().is_empty(),
        "prints the caBundle"
    );

    let kplug = Kplug::start(&cluster, &kubeconfig, &certs);
    kplug
        .log
        .wait_for(Duration::from_secs(10), "the auth ConfigMap loaded", |l| {
            l.contains("loaded kube-system/extension-apiserver-authentication")
                && l.contains("front_proxy=true")
        });

    // Register through the real APIService; on loopback the Service is an
    // ExternalName for localhost on kplug's port.
    cluster.kubectl_ok(&["-n", "kplug-system", "delete", "service", "kplug"]);
    cluster.apply(&format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: kplug, namespace: kplug-system}}\nspec:\n  type: ExternalName\n  externalName: localhost\n  ports:\n  - {{name: https, port: {}}}\n",
        kplug.https
    ));
    let apiservice = Command::new(repo_root().join("apiservice/render.sh"))
        .arg(certs.join("ca.crt"))
        .args(["kplug", "kplug-system", &kplug.https.to_string()])
        .output()
        .expect("apiservice/render.sh");
    assert!(apiservice.status.success(), "{}", text(&apiservice));
    cluster.apply(&String::from_utf8_lossy(&apiservice.stdout));
    wait_until("APIService Available=True", Duration::from_secs(60), || {
        let out = cluster.kubectl_ok(&[
            "get",
            "apiservice",
            "v1alpha1.plugins.kplug.io",
            "-o",
            "json",
        ]);
        let service: Value = serde_json::from_str(&out).map_err(|e| e.to_string())?;
        let available = service["status"]["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "Available").cloned())
            .unwrap_or_default();
        (available["status"] == "True")
            .then_some(())
            .ok_or_else(|| available.to_string())
    });

    // The aggregator's proxy for a new group can lag the Available condition.
    wait_until(
        "the group served through kube-apiserver",
        Duration::from_secs(30),
        || {
            let out = cluster.kubectl(&["get", "--raw", "/apis/plugins.kplug.io/v1alpha1"]);
            out.status.success().then_some(()).ok_or_else(|| text(&out))
        },
    );
    let out = cluster.kubectl(&["get", "plugins"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("No resources found"), "{}", text(&out));
    // The aggregator may read kplug's OpenAPI (deploy/aggregator-openapi.yaml).
    assert!(
        !kplug_refused_openapi(&kplug),
        "the aggregator was refused kplug's OpenAPI"
    );

    // A plugin heartbeating with a ServiceAccount token that may.
    cluster.kubectl_ok(&["create", "namespace", "plugins"]);
    cluster.service_account_with_role("hello-a", Some("hello-a"));
    let token_a = work.path().join("hello-a.token");
    std::fs::write(&token_a, cluster.token("plugins", "hello-a")).expect("token file");
    let (mut watch, watch_lines) = {
        let mut child = Command::new(KUBECTL)
            .arg("--kubeconfig")
            .arg(cluster.var("KPLUG_KUBECONFIG"))
            .args(["get", "plugins", "-w", "--output-watch-events"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("kubectl get -w");
        let lines = Lines::new(child.stdout.take().expect("stdout"));
        (
            Process {
                child,
                name: "watch".to_owned(),
            },
            lines,
        )
    };
    std::thread::sleep(Duration::from_millis(500));
    let _hello_a = hello_plugin(&kplug, "hello-a", &token_a);
    watch_lines.wait_for(
        Duration::from_secs(30),
        "ADDED hello-a through kube-apiserver",
        |l| l.starts_with("ADDED") && l.contains("hello-a"),
    );
    watch.kill();
    let plugin: Value =
        serde_json::from_str(&cluster.kubectl_ok(&["get", "plugin", "hello-a", "-o", "json"]))
            .expect("plugin JSON");
    assert_eq!(
        plugin["status"]["registeredBy"],
        "system:serviceaccount:plugins:hello-a"
    );

    // No heartbeat role: refused, never listed.
    cluster.service_account_with_role("no-role", None);
    let token_none = work.path().join("no-role.token");
    std::fs::write(&token_none, cluster.token("plugins", "no-role")).expect("token file");
    let _no_role = hello_plugin(&kplug, "no-role", &token_none);
    kplug
        .log
        .wait_for(Duration::from_secs(20), "a refused heartbeat", |l| {
            l.contains("heartbeat refused") && l.contains("no-role")
        });
    let listed = cluster.kubectl_ok(&["get", "plugins", "-o", "name"]);
    assert!(!listed.contains("no-role"), "{listed}");

    // Another identity, even one allowed to use the name, cannot take over a live plugin.
    cluster.service_account_with_role("thief", Some("hello-a"));
    let token_thief = work.path().join("thief.token");
    std::fs::write(&token_thief, cluster.token("plugins", "thief")).expect("token file");
    let _thief = hello_plugin(&kplug, "hello-a", &token_thief);
    kplug
        .log
        .wait_for(Duration::from_secs(20), "an IdentityConflict", |l| {
            l.contains("IdentityConflict")
        });
    let plugin: Value =
        serde_json::from_str(&cluster.kubectl_ok(&["get", "plugin", "hello-a", "-o", "json"]))
            .expect("plugin JSON");
    assert_eq!(
        plugin["status"]["registeredBy"],
        "system:serviceaccount:plugins:hello-a"
    );

    // RBAC through kube-apiserver: nothing without a role, the shipped roles work.
    let reconcile_file = work.path().join("reconcile.json");
    std::fs::write(
        &reconcile_file,
        json!({"apiVersion": "plugins.kplug.io/v1alpha1", "kind": "Reconcile", "spec": {"object": {"apiVersion": "example.com/v1", "kind": "Greeting", "metadata": {"name": "ada"}}}}).to_string(),
    )
    .expect("request file");
    let reconcile_path = "/apis/plugins.kplug.io/v1alpha1/plugins/hello-a/reconcile";
    let reconcile_args = [
        "create",
        "--raw",
        reconcile_path,
        "-f",
        &reconcile_file.to_string_lossy(),
    ]
    .map(str::to_owned);
    let as_someone = |args: &[String]| {
        let mut full = vec!["--as=someone".to_owned()];
        full.extend_from_slice(args);
        cluster.kubectl(&full.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let denied = as_someone(&["get".to_owned(), "plugins".to_owned()]);
    assert!(
        !denied.status.success() && text(&denied).contains("Forbidden"),
        "{}",
        text(&denied)
    );
    let denied = as_someone(&reconcile_args);
    assert!(
        !denied.status.success() && text(&denied).contains("forbidden"),
        "{}",
        text(&denied)
    );
    let can_i = |verb: &str, subresource: &str| {
        let output = cluster.kubectl(&[
            "auth",
            "can-i",
            verb,
            "plugins.plugins.kplug.io",
            &format!("--subresource={subresource}"),
            "--as=someone",
        ]);
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    };
    assert_eq!(can_i("list", ""), "no");
    assert_eq!(can_i("create", "reconcile"), "no");
    cluster.kubectl_ok(&[
        "create",
        "clusterrolebinding",
        "someone-reads",
        "--clusterrole=kplug:reader",
        "--user=someone",
    ]);
    cluster.kubectl_ok(&[
        "create",
        "clusterrolebinding",
        "someone-reconciles",
        "--clusterrole=kplug:operator",
        "--user=someone",
    ]);
    wait_until(
        "someone may list and reconcile",
        Duration::from_secs(20),
        || {
            let listed = as_someone(&["get".to_owned(), "plugins".to_owned()]);
            let reconciled = as_someone(&reconcile_args);
            (listed.status.success() && reconciled.status.success())
                .then_some(())
                .ok_or_else(|| format!("{} / {}", text(&listed), text(&reconciled)))
        },
    );
    let answer: Value =
        serde_json::from_slice(&as_someone(&reconcile_args).stdout).expect("reconcile answer");
    assert_eq!(
        answer["status"]["objectStatus"]["greeting"], "hello, ada",
        "{answer:#}"
    );
    assert_eq!(can_i("list", ""), "yes");
    assert_eq!(can_i("create", "reconcile"), "yes");

    // The database example through kube-apiserver: the PostgreSQL plugin
    // heartbeats with its own ServiceAccount, an operator reconciles.
    let pg = Postgres::start();
    let pg_name = "database-table-postgresql-plugin";
    cluster.service_account_with_role(pg_name, Some(pg_name));
    let pg_token = work.path().join("pg.token");
    std::fs::write(&pg_token, cluster.token("plugins", pg_name)).expect("token file");
    let pg_plugin = Command::new(venv_python())
        .args([
            "-m",
            "postgresql_plugin",
            "--heartbeat-interval",
            "1s",
            "--dsn",
            &pg.dsn,
        ])
        .args(["--registry", &format!("https://localhost:{}", kplug.grpc)])
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .arg("--registry-ca-file")
        .arg(kplug.certs.join("ca.crt"))
        .arg("--token-file")
        .arg(&pg_token)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the PostgreSQL plugin (run hack/python-env.sh first)");
    let _pg_plugin = Process {
        child: pg_plugin,
        name: pg_name.to_owned(),
    };
    wait_until(
        "the PostgreSQL plugin listed",
        Duration::from_secs(30),
        || {
            let out = cluster.kubectl(&["get", "plugin", pg_name]);
            out.status.success().then_some(()).ok_or_else(|| text(&out))
        },
    );
    let table_request = work.path().join("table.json");
    std::fs::write(
        &table_request,
        json!({"apiVersion": "plugins.kplug.io/v1alpha1", "kind": "Reconcile", "spec": {
            "api": {"group": "myorg.org", "resource": "databasetables"},
            "preferredImplementation": "PostgreSQL",
            "object": {"apiVersion": "myorg.org/v1alpha1", "kind": "DatabaseTable", "metadata": {"name": "accounts"},
                       "spec": {"serverName": "accounts-db", "columns": [{"name": "id", "type": "uint64"}, {"name": "owner", "type": "string"}]}},
        }})
        .to_string(),
    )
    .expect("request file");
    let answer = as_someone(
        &[
            "create",
            "-f",
            &table_request.to_string_lossy(),
            "-o",
            "json",
        ]
        .map(str::to_owned),
    );
    assert!(answer.status.success(), "{}", text(&answer));
    let answer: Value = serde_json::from_slice(&answer.stdout).expect("reconcile answer");
    assert_eq!(answer["status"]["plugin"]["name"], pg_name, "{answer:#}");
    assert_eq!(
        answer["status"]["success"], true,
        "{:#}",
        answer["status"]["results"]
    );
    assert_eq!(
        pg.query("select string_agg(column_name, ',' order by column_name) from information_schema.columns where table_name = 'accounts'"),
        "id,owner"
    );

    // kplug's own checks, straight at kplug.
    let front_proxy = (
        cluster.var("KPLUG_FRONT_PROXY_CLIENT_CERT"),
        cluster.var("KPLUG_FRONT_PROXY_CLIENT_KEY"),
    );
    let plugins = "/apis/plugins.kplug.io/v1alpha1/plugins";
    // Forged identity headers without the front-proxy certificate: 401.
    let (_, code, body) = kplug.curl(
        None,
        &["X-Remote-User: admin", "X-Remote-Group: system:masters"],
        plugins,
    );
    assert_eq!(code, 401, "{body}");
    // The front proxy asserting a user without the role: kplug's own SAR says 403.
    let (_, code, body) = kplug.curl(
        Some((&front_proxy.0, &front_proxy.1)),
        &[
            "X-Remote-User: nobody",
            "X-Remote-Group: system:authenticated",
        ],
        plugins,
    );
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains("cannot list resource \\\"plugins\\\""),
        "{body}"
    );
    // A front-proxy CA certificate whose CN is not in requestheader-allowed-names: 401.
    let (cert, key) = client_cert(
        work.path(),
        "impostor",
        &cluster.var("KPLUG_FRONT_PROXY_CA_CERT"),
        &cluster.var("KPLUG_FRONT_PROXY_CA_KEY"),
    );
    let (_, code, body) = kplug.curl(
        Some((&cert, &key)),
        &["X-Remote-User: admin", "X-Remote-Group: system:masters"],
        plugins,
    );
    assert_eq!(code, 401, "{body}");
    // A client certificate from a CA kplug does not trust: the handshake fails.
    let stranger = work.path().join("stranger");
    let made = Command::new(env!("CARGO_BIN_EXE_kplug-apiserver"))
        .args(["certs", "--out-dir"])
        .arg(&stranger)
        .output()
        .expect("stranger CA");
    assert!(made.status.success());
    let (stranger_cert, stranger_key) = client_cert(
        work.path(),
        "stranger",
        &stranger.join("ca.crt").to_string_lossy(),
        &stranger.join("ca.key").to_string_lossy(),
    );
    let (exit, code, _) = kplug.curl(Some((&stranger_cert, &stranger_key)), &[], plugins);
    assert!(
        exit != 0 && code == 0,
        "a foreign client certificate must fail the handshake"
    );
    // Malformed and expired bearer tokens: 401.
    let (_, code, body) = kplug.curl(None, &["Authorization: Bearer not-a-jwt"], plugins);
    assert_eq!(code, 401, "{body}");
    let (_, code, body) = kplug.curl(
        None,
        &[&format!(
            "Authorization: Bearer {}",
            expired_token(&cluster)
        )],
        plugins,
    );
    assert_eq!(code, 401, "{body}");
    // A valid token authenticates, and authorization still applies.
    let (_, code, body) = kplug.curl(
        None,
        &[&format!(
            "Authorization: Bearer {}",
            std::fs::read_to_string(&token_a).unwrap_or_default()
        )],
        plugins,
    );
    assert_eq!(
        code, 403,
        "a plugin's token may heartbeat, not list: {body}"
    );
    // Probes need nothing.
    let (_, code, _) = kplug.curl(None, &[], "/readyz");
    assert_eq!(code, 200);

    // The auth ConfigMap changed while running: followed.
    cluster.kubectl_ok(&[
        "-n",
        "kube-system",
        "patch",
        "configmap",
        "extension-apiserver-authentication",
        "--type=merge",
        "-p",
        r#"{"data":{"kplug-e2e":"changed"}}"#,
    ]);
    kplug
        .log
        .wait_for(Duration::from_secs(20), "the change loaded", |l| {
            l.contains("loaded kube-system/extension-apiserver-authentication")
        });

    // The serving certificate rotated (same CA): served without a restart.
    let fingerprint = || {
        let output = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "openssl s_client -connect 127.0.0.1:{} -servername localhost </dev/null 2>/dev/null | openssl x509 -noout -fingerprint -sha256",
                kplug.https
            ))
            .output()
            .expect("openssl s_client");
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    };
    let before = fingerprint();
    assert!(before.contains("Fingerprint"), "{before}");
    let rotated = Command::new(env!("CARGO_BIN_EXE_kplug-apiserver"))
        .args(["certs", "--out-dir"])
        .arg(&certs)
        .arg("--ca-cert")
        .arg(certs.join("ca.crt"))
        .arg("--ca-key")
        .arg(certs.join("ca.key"))
        .output()
        .expect("rotate the serving certificate");
    assert!(rotated.status.success(), "{}", text(&rotated));
    kplug
        .log
        .wait_for(Duration::from_secs(20), "the reload logged", |l| {
            l.contains("serving certificate reloaded")
        });
    let after = fingerprint();
    assert!(
        after.contains("Fingerprint") && after != before,
        "{before} / {after}"
    );
    let out = cluster.kubectl(&["get", "plugins", "-o", "name"]);
    assert!(
        out.status.success(),
        "through the aggregator after rotation: {}",
        text(&out)
    );

    // The auth ConfigMap deleted while running: logged, the last trust kept.
    cluster.kubectl_ok(&[
        "-n",
        "kube-system",
        "delete",
        "configmap",
        "extension-apiserver-authentication",
    ]);
    kplug
        .log
        .wait_for(Duration::from_secs(20), "the deletion logged", |l| {
            l.contains("was deleted: keeping the last trust")
        });
    let out = cluster.kubectl(&["get", "plugins", "-o", "name"]);
    assert!(
        out.status.success() && text(&out).contains("hello-a"),
        "{}",
        text(&out)
    );
}
