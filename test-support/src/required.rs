//! What a test needs from the machine. Under CI (`CI` set, as `.ci/run`
//! runs) a missing tool fails the test that needs it, naming the path: a
//! test that cannot run must not pass there. Elsewhere the test says what
//! is missing and how to install it, and checks nothing.

use std::path::PathBuf;

/// `path` when it exists. Missing: a panic under CI, else a line on stderr
/// and `None`, and the caller returns.
pub fn tool(path: &str, install: &str) -> Option<PathBuf> {
    let found = PathBuf::from(path);
    if found.exists() {
        return Some(found);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{path} is missing, and CI runs every test: {install}"
    );
    eprintln!("SKIPPED, checking nothing: {path} is missing ({install})");
    None
}
