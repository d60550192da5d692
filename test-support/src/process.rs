//! Child processes that never outlive a test, their output read with
//! deadlines, and polling with a deadline.

use std::fmt::Display;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, PoisonError, mpsc};
use std::time::{Duration, Instant};

/// A child process, killed when dropped, so that a failing test (or a
/// bench that returns an error) leaves no process behind.
pub struct Process {
    pub child: Child,
    /// What the process is, for messages.
    pub name: String,
}

impl Process {
    /// Owns `child` under `name`.
    pub fn new(child: Child, name: &str) -> Self {
        Self {
            child,
            name: name.to_owned(),
        }
    }

    /// Spawns `command`; panics naming `name` when it cannot start.
    pub fn spawn(command: &mut Command, name: &str) -> Self {
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name} ({:?}): {e}", command.get_program()));
        Self::new(child, name)
    }

    /// Spawns `command` with its stdout piped and read as [`Lines`].
    pub fn spawn_with_stdout(command: &mut Command, name: &str) -> (Self, Lines) {
        let mut process = Self::spawn(command.stdout(Stdio::piped()), name);
        let stdout = process.child.stdout.take().expect("stdout is piped");
        (process, Lines::new(stdout))
    }

    /// Spawns `command` with its stderr piped and read as [`Lines`].
    pub fn spawn_with_stderr(command: &mut Command, name: &str) -> (Self, Lines) {
        let mut process = Self::spawn(command.stderr(Stdio::piped()), name);
        let stderr = process.child.stderr.take().expect("stderr is piped");
        (process, Lines::new(stderr))
    }

    /// Spawns `command` with its stderr a pipe whose reading end is closed
    /// at once: every write to it fails with EPIPE, as when whatever
    /// collected the process's log has gone.
    pub fn spawn_with_lost_stderr(command: &mut Command, name: &str) -> Self {
        let mut process = Self::spawn(command.stderr(Stdio::piped()), name);
        drop(process.child.stderr.take());
        process
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, then reaps the process; does nothing when it has exited.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM and waits up to `within` for the exit, returning whether
    /// it was clean; kills the process when it does not exit in time.
    pub fn terminate(&mut self, within: Duration) -> bool {
        // std has no SIGTERM; kill(1) is on every machine the tests run on.
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.success();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        false
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Reads a child's stdout or stderr line by line on a thread, so that tests
/// can wait for a line with a deadline, and so that the child never blocks
/// on a full pipe whether or not anyone reads.
pub struct Lines(Mutex<mpsc::Receiver<String>>);

impl Lines {
    /// Starts reading `reader` (a `ChildStdout` or `ChildStderr`).
    pub fn new(reader: impl Read + Send + 'static) -> Self {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            // Once no one listens (the `Lines` dropped), lines are still
            // read, and dropped: closing the pipe would fail the child's
            // next write, and a Rust child's logger panics on that
            // (tracing-subscriber reports a failed write with `eprintln!`),
            // taking down the call it logs for.
            let mut listening = true;
            for line in BufReader::new(reader).lines().map_while(Result::ok) {
                listening = listening && tx.send(line).is_ok();
            }
        });
        Self(Mutex::new(rx))
    }

    /// Every line received so far and not yet read.
    pub fn drain(&self) -> Vec<String> {
        let receiver = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        receiver.try_iter().collect()
    }

    /// The first line not read yet that satisfies `want` (the lines before
    /// it are consumed); panics after `within`, naming `what` and listing
    /// the lines seen.
    pub fn wait_for(&self, within: Duration, what: &str, want: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + within;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let received = self
                .0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .recv_timeout(left);
            match received {
                Ok(line) if want(&line) => return line,
                Ok(line) => seen.push(line),
                Err(_) => panic!("timed out after {within:?} waiting for {what}; saw: {seen:#?}"),
            }
        }
    }

    /// Every line not read yet up to the end of the stream, which comes
    /// when the process closes it, usually by exiting; panics after
    /// `within`, naming `what` and listing the lines read.
    pub fn until_closed(&self, within: Duration, what: &str) -> Vec<String> {
        let deadline = Instant::now() + within;
        let receiver = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let mut lines = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match receiver.recv_timeout(left) {
                Ok(line) => lines.push(line),
                Err(mpsc::RecvTimeoutError::Disconnected) => return lines,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!("{what} still open after {within:?}; read: {lines:#?}")
                }
            }
        }
    }
}

/// A loopback port nothing listens on right now (another process may take
/// it before the caller binds it; tests accept that small race).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// Calls `check` every 250 ms until it succeeds; panics with `what` and the
/// last error when `within` has passed.
pub fn wait_until<E: Display>(
    what: &str,
    within: Duration,
    mut check: impl FnMut() -> Result<(), E>,
) {
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

/// A finished command's stdout followed by its stderr, for messages.
pub fn output_text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}
