//! curl, the independent HTTPS client the tests check kplug's API with.

use std::path::Path;
use std::process::Command;

/// One request with curl.
pub(crate) struct Curl<'a> {
    /// The CA that must have signed the server's certificate.
    pub ca: &'a Path,
    /// A client certificate and key to present, if any.
    pub client: Option<(&'a Path, &'a Path)>,
    pub method: &'a str,
    pub url: &'a str,
    /// `Name: value` lines.
    pub headers: &'a [&'a str],
    pub body: Option<&'a str>,
}

impl Curl<'_> {
    /// Sends the request (10 s at most); returns (curl's exit code, HTTP
    /// status or 0 when there was no response, body).
    pub(crate) fn send(&self) -> (i32, u16, String) {
        let mut command = Command::new("curl");
        command
            .args([
                "-sS",
                "--max-time",
                "10",
                "-X",
                self.method,
                "-w",
                "\n%{http_code}",
            ])
            .arg("--cacert")
            .arg(self.ca);
        if let Some((cert, key)) = self.client {
            command.arg("--cert").arg(cert).arg("--key").arg(key);
        }
        for header in self.headers {
            command.args(["-H", header]);
        }
        if let Some(body) = self.body {
            command.args(["--data-binary", body]);
        }
        let output = command.arg(self.url).output().expect("run curl");
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let (body, code) = stdout.rsplit_once('\n').unwrap_or(("", &stdout));
        (
            output.status.code().unwrap_or(-1),
            code.trim().parse().unwrap_or(0),
            body.to_owned(),
        )
    }
}
