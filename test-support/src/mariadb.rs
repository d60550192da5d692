//! A private MariaDB server for tests: its own data directory, socket and
//! port, a real user and the database `kplug_test`.
//!
//! One server per test binary ([`shared`]), started on first use; tests
//! share it by using distinct table names. It needs the `mariadbd` and
//! `mariadb-install-db` of Debian's `mariadb-server` package; when they are
//! missing or the server does not come up, [`shared`] panics with the
//! reason, so no test is skipped silently.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::process::free_port;

/// The database tests create their tables in.
pub const DATABASE: &str = "kplug_test";
const USER: &str = "kplug";
const PASSWORD: &str = "kplug-test-password";
/// Bounds the server's start-up.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A running server; it stops when the test process exits.
pub struct MariaDb {
    /// The TCP port on 127.0.0.1.
    pub port: u16,
    /// The unix socket.
    pub socket: PathBuf,
    _server: Child,
    /// Closing this (at process exit) makes the watchdog stop the server
    /// and delete its files; statics are never dropped, so nothing else
    /// would.
    _watchdog: ChildStdin,
}

impl MariaDb {
    /// The plugin's user over TCP. `prefer_socket=false` keeps the driver
    /// from switching to the socket, so TCP is what gets tested.
    pub fn tcp_url(&self) -> String {
        format!(
            "mysql://{USER}:{PASSWORD}@127.0.0.1:{}/{DATABASE}?prefer_socket=false",
            self.port
        )
    }

    /// Runs `sql` with the mariadb client as the plugin's user and returns
    /// its tab-separated output, trimmed.
    pub fn query(&self, sql: &str) -> String {
        let output = Command::new("mariadb")
            .arg(format!("--socket={}", self.socket.display()))
            .args([
                "-u",
                USER,
                &format!("-p{PASSWORD}"),
                DATABASE,
                "-N",
                "-B",
                "-e",
                sql,
            ])
            .stdin(Stdio::null())
            .output()
            .expect("run the mariadb client");
        assert!(
            output.status.success(),
            "mariadb {sql}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// The plugin's user over the unix socket.
    pub fn socket_url(&self) -> String {
        format!(
            "mysql://{USER}:{PASSWORD}@localhost/{DATABASE}?socket={}",
            self.socket.display()
        )
    }
}

/// The test binary's server, started on first use.
///
/// # Panics
///
/// When the server cannot be started, with the reason.
pub fn shared() -> &'static MariaDb {
    static SERVER: OnceLock<Result<MariaDb, String>> = OnceLock::new();
    match SERVER.get_or_init(start) {
        Ok(server) => server,
        Err(reason) => panic!("cannot start a private MariaDB server: {reason}"),
    }
}

fn start() -> Result<MariaDb, String> {
    let mariadbd = find(&["mariadbd", "mysqld"])?;
    let install_db = find(&["mariadb-install-db", "mysql_install_db"])?;
    let client = find(&["mariadb", "mysql"])?;
    // Kept past this function: the watchdog deletes it with the server.
    let dir = tempfile::Builder::new()
        .prefix("kplug-mariadb-")
        .tempdir()
        .map_err(|e| format!("cannot create a temporary directory: {e}"))?
        .keep();
    let data = dir.join("data");
    let socket = dir.join("mariadb.sock");
    let error_log = dir.join("error.log");
    // mariadbd refuses to run as root unless told to.
    let as_root = run(Command::new("id").arg("-u"))?.trim() == "0";
    let user_flag = as_root.then_some("--user=root");

    let mut install = Command::new(&install_db);
    install
        .arg("--no-defaults")
        .arg(format!("--datadir={}", data.display()))
        .arg("--auth-root-authentication-method=normal")
        .arg("--skip-test-db")
        .args(user_flag);
    run(&mut install).map_err(|e| format!("mariadb-install-db failed: {e}"))?;

    let port = free_port();
    let mut server = Command::new(&mariadbd)
        .arg("--no-defaults")
        .arg(format!("--datadir={}", data.display()))
        .arg(format!("--socket={}", socket.display()))
        .arg(format!("--port={port}"))
        .arg("--bind-address=127.0.0.1")
        .arg(format!("--pid-file={}", dir.join("mariadb.pid").display()))
        .arg(format!("--log-error={}", error_log.display()))
        .arg("--skip-name-resolve")
        .arg("--innodb-buffer-pool-size=32M")
        .args(user_flag)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", mariadbd.display()))?;
    let watchdog = watchdog(server.id(), &dir)?;

    let root = |sql: &str| {
        run(Command::new(&client)
            .arg("--no-defaults")
            .arg(format!("--socket={}", socket.display()))
            .args(["--user=root", "--batch", "-e", sql]))
    };
    let started = Instant::now();
    loop {
        if let Ok(Some(status)) = server.try_wait() {
            return Err(format!(
                "mariadbd exited with {status}; its log ends with:\n{}",
                tail(&error_log)
            ));
        }
        if root("SELECT 1").is_ok() {
            break;
        }
        if started.elapsed() > START_TIMEOUT {
            return Err(format!(
                "mariadbd did not accept connections within {START_TIMEOUT:?}; its log ends \
                 with:\n{}",
                tail(&error_log)
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    root(&format!(
        "CREATE DATABASE {DATABASE}; \
         CREATE USER '{USER}'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}'; \
         CREATE USER '{USER}'@'localhost' IDENTIFIED BY '{PASSWORD}'; \
         GRANT ALL ON {DATABASE}.* TO '{USER}'@'127.0.0.1', '{USER}'@'localhost';"
    ))
    .map_err(|e| format!("cannot create the test database and user: {e}"))?;
    Ok(MariaDb {
        port,
        socket,
        _server: server,
        _watchdog: watchdog,
    })
}

/// A shell that waits for its stdin to close, then stops the server
/// (bounded, in case it cannot be reaped) and removes `dir`.
fn watchdog(pid: u32, dir: &Path) -> Result<ChildStdin, String> {
    let script = r#"read -r _
kill -TERM "$0" 2>/dev/null
for _ in $(seq 300); do kill -0 "$0" 2>/dev/null || break; sleep 0.1; done
rm -rf "$1""#;
    let mut child = Command::new("sh")
        .args(["-c", script])
        .arg(pid.to_string())
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start the watchdog shell: {e}"))?;
    child
        .stdin
        .take()
        .ok_or_else(|| "the watchdog has no stdin".to_owned())
}

/// The first of `names` on PATH or in /usr/sbin, where Debian puts mariadbd.
fn find(names: &[&str]) -> Result<PathBuf, String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs: Vec<PathBuf> = std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/local/sbin")])
        .collect();
    names
        .iter()
        .flat_map(|name| dirs.iter().map(move |dir| dir.join(name)))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| {
            format!(
                "none of {names:?} is installed; install MariaDB with \
                 `apt-get install -y mariadb-server`"
            )
        })
}

/// Runs `command` to completion; its stdout, or its stderr as the error.
fn run(command: &mut Command) -> Result<String, String> {
    let output = command.output().map_err(|e| match e.kind() {
        ErrorKind::NotFound => format!("{:?} not found", command.get_program()),
        _ => format!("cannot run {:?}: {e}", command.get_program()),
    })?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "{:?} exited with {}: {}",
            command.get_program(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// The last lines of a log, for error messages.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| format!("(no log: {e})"));
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
