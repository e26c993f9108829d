//! A PostgreSQL cluster of the suite's own, so that it can be restarted hard: `initdb` into
//! a temporary folder, started with `pg_ctl` on a free port of 127.0.0.1, stopped and
//! removed when dropped (also when the test panics).
//!
//! As root, the cluster runs as the user `postgres` (or `nobody`): PostgreSQL refuses root.

use std::net::TcpListener;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Where to look for the server programs besides `PATH`.
const PROGRAM_FOLDERS: &[&str] = &["/usr/local/bin", "/usr/local/pgsql/bin", "/usr/bin"];

/// What to run when the server programs are missing.
const INSTALL_HINT: &str = "the fault suite starts a PostgreSQL cluster of its own and needs the server \
     programs initdb, pg_ctl and postgres: install them (Debian or Ubuntu: \
     `sudo apt-get install -y postgresql`, then put /usr/lib/postgresql/<version>/bin on PATH; \
     Fedora: `sudo dnf install -y postgresql-server`) and run the test again";

/// A running throwaway cluster.
pub struct ThrowawayPostgres {
    folder: PathBuf,
    data: PathBuf,
    bin: PathBuf,
    port: u16,
    /// The unprivileged user the cluster runs as, when the test runs as root.
    run_as: Option<&'static str>,
}

impl ThrowawayPostgres {
    /// Creates and starts a cluster with trust authentication on loopback only, with a
    /// short deadlock timeout (the suite forces deadlocks) and a commit delay that widens
    /// the window in which a `COMMIT` is in flight.
    ///
    /// # Panics
    ///
    /// When `initdb` or `pg_ctl` is missing (saying what to install), or when the cluster
    /// does not start (with the end of its log).
    pub fn start() -> Self {
        let bin = find_programs().unwrap_or_else(|| panic!("{INSTALL_HINT}"));
        let folder = std::env::temp_dir().join(format!(
            "idem-faults-postgres-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&folder).expect("create the cluster's folder");
        let run_as = running_as_root().then(unprivileged_user);
        let cluster = ThrowawayPostgres {
            data: folder.join("data"),
            folder,
            bin,
            port: free_port(),
            run_as,
        };
        if let Some(user) = run_as {
            let status = Command::new("chown")
                .args([user, &cluster.folder.display().to_string()])
                .status()
                .expect("run chown");
            assert!(
                status.success(),
                "chown {user} of the cluster's folder failed"
            );
        }
        let data = cluster.data.display().to_string();
        let initdb = cluster.run(
            "initdb",
            &[
                "-D",
                &data,
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--no-locale",
                "--no-sync",
            ],
        );
        assert!(
            initdb.status.success(),
            "initdb failed: {}{}",
            String::from_utf8_lossy(&initdb.stdout),
            String::from_utf8_lossy(&initdb.stderr)
        );
        cluster.pg_ctl_start();
        cluster
    }

    /// The cluster's URL (database `postgres`, user `postgres`).
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Restarts the server hard: `pg_ctl restart -m immediate` (every backend is killed
    /// without a checkpoint; the restart recovers from the WAL). Blocking.
    ///
    /// # Panics
    ///
    /// When the server does not come back.
    pub fn restart_immediately(&self) {
        let data = self.data.display().to_string();
        let log = self.log().display().to_string();
        let restarted = self.run(
            "pg_ctl",
            &[
                "restart",
                "-D",
                &data,
                "-m",
                "immediate",
                "-w",
                "-t",
                "120",
                "-l",
                &log,
            ],
        );
        assert!(
            restarted.status.success(),
            "pg_ctl restart -m immediate failed: {}\nthe end of the log:\n{}",
            String::from_utf8_lossy(&restarted.stderr),
            self.log_tail()
        );
    }

    fn pg_ctl_start(&self) {
        let data = self.data.display().to_string();
        let log = self.log().display().to_string();
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories='' \
             -c max_connections=200 -c deadlock_timeout=100ms \
             -c commit_delay=2000 -c commit_siblings=1 -c shared_buffers=64MB",
            self.port
        );
        let started = self.run(
            "pg_ctl",
            &[
                "start", "-D", &data, "-w", "-t", "120", "-l", &log, "-o", &options,
            ],
        );
        assert!(
            started.status.success(),
            "pg_ctl start failed: {}\nthe end of the log:\n{}",
            String::from_utf8_lossy(&started.stderr),
            self.log_tail()
        );
    }

    fn log(&self) -> PathBuf {
        self.folder.join("postgres.log")
    }

    /// The last lines of the server's log.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.log()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Runs one of the server programs, as the cluster's user.
    fn run(&self, program: &str, args: &[&str]) -> Output {
        let path = self.bin.join(program);
        let mut command = match self.run_as {
            Some(user) => {
                let mut command = Command::new("runuser");
                command.args(["-u", user, "--"]).arg(&path);
                command
            }
            None => Command::new(&path),
        };
        command
            .args(args)
            .current_dir("/")
            .output()
            .unwrap_or_else(|error| panic!("run {}: {error}", path.display()))
    }
}

impl Drop for ThrowawayPostgres {
    fn drop(&mut self) {
        let data = self.data.display().to_string();
        let _ = self.run(
            "pg_ctl",
            &["stop", "-D", &data, "-m", "immediate", "-w", "-t", "30"],
        );
        let _ = std::fs::remove_dir_all(&self.folder);
    }
}

/// The folder that holds `initdb`, `pg_ctl` and `postgres`: on `PATH`, in the usual
/// folders, or where Debian's packages put them.
fn find_programs() -> Option<PathBuf> {
    let mut folders: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect())
        .unwrap_or_default();
    folders.extend(PROGRAM_FOLDERS.iter().map(PathBuf::from));
    if let Ok(versions) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut versions: Vec<PathBuf> = versions
            .filter_map(Result::ok)
            .map(|entry| entry.path().join("bin"))
            .collect();
        versions.sort();
        folders.extend(versions.into_iter().rev());
    }
    folders.into_iter().find(|folder| {
        ["initdb", "pg_ctl", "postgres"]
            .iter()
            .all(|program| is_executable(&folder.join(program)))
    })
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|meta| meta.is_file() && meta.mode() & 0o111 != 0)
}

/// Whether this process runs as root (the owner of `/proc/self` is the effective user).
fn running_as_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|meta| meta.uid() == 0)
}

/// `postgres` when that user exists, `nobody` otherwise.
fn unprivileged_user() -> &'static str {
    let exists = Command::new("id")
        .args(["-u", "postgres"])
        .output()
        .is_ok_and(|output| output.status.success());
    if exists { "postgres" } else { "nobody" }
}

/// A loopback port where nothing listens, below the usual ephemeral range, so that no
/// outgoing connection takes it between this check and the server's start.
fn free_port() -> u16 {
    let offset = u16::try_from((std::process::id() * 13) % 9_000).unwrap_or(0);
    (21_000 + offset..30_000)
        .chain(21_000..21_000 + offset)
        .find(|port| TcpListener::bind(("127.0.0.1", *port)).is_ok())
        .expect("a free port")
}
