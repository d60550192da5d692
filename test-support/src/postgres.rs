//! A private PostgreSQL for tests, and the Python that runs the PostgreSQL plugin.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::process::free_port;
use crate::workspace::repo_root;

/// A private PostgreSQL from `hack/postgres.sh`, stopped on drop.
pub struct Postgres {
    dir: PathBuf,
    /// A libpq connection string for the test database.
    pub dsn: String,
}

impl Postgres {
    /// Starts a server with a fresh data directory; `dsn` reaches it.
    pub fn start() -> Self {
        // Under /tmp and world-readable: as root the server runs as nobody.
        let dir = std::env::temp_dir().join(format!(
            "kplug-e2e-pg-{}-{}",
            std::process::id(),
            free_port()
        ));
        let output = Command::new(repo_root().join("hack/postgres.sh"))
            .arg("start")
            .arg(&dir)
            .stderr(Stdio::inherit())
            .output()
            .expect("run hack/postgres.sh");
        assert!(output.status.success(), "PostgreSQL did not start");
        let dsn = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        Self { dir, dsn }
    }

    /// One value from a catalog query, via psql.
    pub fn query(&self, sql: &str) -> String {
        let output = Command::new("psql")
            .args([&self.dsn, "-XAtq", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .output()
            .expect("run psql");
        assert!(
            output.status.success(),
            "psql {sql}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// The columns of the table `table` in the schema public, as
    /// "name type, ...", or "NULL" when there is no such table.
    pub fn columns(&self, table: &str) -> String {
        self.query(&format!(
            "select coalesce(string_agg(column_name || ' ' || data_type, ', ' order by ordinal_position), 'NULL') \
             from information_schema.columns where table_schema = 'public' and table_name = '{table}'"
        ))
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = Command::new(repo_root().join("hack/postgres.sh"))
            .arg("stop")
            .arg(&self.dir)
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The Python of the virtualenv `hack/python-env.sh` makes.
pub fn venv_python() -> PathBuf {
    std::env::var_os("KPLUG_VENV")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/kplug/venv")))
        .expect("KPLUG_VENV or HOME")
        .join("bin/python")
}
