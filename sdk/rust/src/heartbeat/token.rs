//! The ServiceAccount token file, read afresh for every call because the
//! kubelet rotates projected tokens.

use std::path::{Path, PathBuf};

use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tracing::{debug, info, warn};

/// The ServiceAccount token file, read for every call.
pub(super) struct TokenFile {
    pub(super) path: PathBuf,
    /// What was wrong with the file last time, so that a lasting problem is
    /// logged once at warn rather than with every heartbeat.
    problem: Option<String>,
}

impl TokenFile {
    pub(super) fn new(path: PathBuf) -> Self {
        Self {
            path,
            problem: None,
        }
    }

    /// `Bearer <token>`, or `None` (logged) when the file cannot be used.
    pub(super) async fn authorization(&mut self) -> Option<AsciiMetadataValue> {
        match read_token(&self.path).await {
            Ok(value) => {
                if self.problem.take().is_some() {
                    info!(token_file = %self.path.display(), "the token file is usable again");
                }
                Some(value)
            }
            Err(problem) => {
                if self.problem.as_ref() == Some(&problem) {
                    debug!(token_file = %self.path.display(), %problem, "heartbeating without a token");
                } else {
                    warn!(
                        token_file = %self.path.display(),
                        %problem,
                        "cannot use the ServiceAccount token file; sending without a token, \
                         which kplug in cluster mode refuses"
                    );
                    self.problem = Some(problem);
                }
                None
            }
        }
    }
}

/// The `authorization` value for the token in `path`.
async fn read_token(path: &Path) -> Result<AsciiMetadataValue, String> {
    let text = tokio::fs::read_to_string(path)
        .await
        .map_err(|error| error.to_string())?;
    let token = text.trim();
    if token.is_empty() {
        return Err("the file is empty".to_owned());
    }
    let mut value = MetadataValue::try_from(format!("Bearer {token}"))
        .map_err(|_| "the token has characters a gRPC header cannot carry".to_owned())?;
    // Kept out of HTTP/2 header compression tables.
    value.set_sensitive(true);
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn token_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        let read = |contents: &str| {
            std::fs::write(&path, contents).unwrap();
            read_token(&path)
        };
        let value = read(" abc.def-ghi\n").await.unwrap();
        assert_eq!(value.to_str().unwrap(), "Bearer abc.def-ghi");
        assert!(value.is_sensitive());
        assert_eq!(read(" \n").await.unwrap_err(), "the file is empty");
        assert!(read("a\nb").await.unwrap_err().contains("characters"));
        assert!(read_token(&dir.path().join("missing")).await.is_err());
    }
}
