//! A private PostgreSQL primary with a streaming standby, and the failover from one to the
//! other, as production runs them: the clients reach the primary through one endpoint
//! (a [`Proxy`]) that moves to the standby once it is promoted; the standby streams from
//! the primary through a proxy of its own, which the test pauses to make it lag.
//!
//! Both servers run from the server programs that `scripts/services.sh up postgres`
//! installs (found as its `find_pg_bindir` finds them), in a temporary directory, as the
//! user `postgres` when the test runs as root (PostgreSQL refuses root). A kill takes the
//! postmaster and every backend at once. Both servers are killed and the directory
//! removed when the [`Cluster`] is dropped (kept, with the servers' logs, when the test
//! failed).

use std::fs;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};

use crate::proxy::Proxy;

/// How the primary's commits wait for the standby.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// `synchronous_standby_names = '*'`, `synchronous_commit = on`: a commit returns once
    /// the standby has it on disk, so nothing acknowledged is lost in a failover.
    Synchronous,
    /// A commit returns at once; the standby follows as it can, and what it had not
    /// received when the primary died is lost.
    Asynchronous,
}

impl std::fmt::Display for Replication {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Replication::Synchronous => "sync",
            Replication::Asynchronous => "async",
        })
    }
}

/// How long a server may take to start, or the standby to be promoted.
const START_LIMIT: Duration = Duration::from_secs(60);

/// A primary, its standby, the endpoint the clients use and the link between them.
pub struct Cluster {
    dir: PathBuf,
    bindir: PathBuf,
    owner: Option<(u32, u32)>,
    primary: Server,
    standby: Server,
    /// The clients' address: the primary's, then the promoted standby's.
    endpoint: Proxy,
    /// The standby's replication connection to the primary goes through here.
    link: Proxy,
}

struct Server {
    name: &'static str,
    port: u16,
    child: Option<Child>,
}

impl Server {
    fn address(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Kills the postmaster and every process it forked at once, as a machine dies: the
    /// postmaster is stopped first (it forks no more), then all of them get SIGKILL. (Each
    /// backend is a session of its own, so a signal to the postmaster's process group
    /// would miss them, and a backend outliving its postmaster may still answer a commit.)
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let postmaster = child.id();
            // The shell's own `kill`: no procps needed.
            let kill = |signal: &str, pids: &[u32]| {
                let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
                let _ = Command::new("sh")
                    .arg("-c")
                    .arg(format!("kill -{signal} {}", pids.join(" ")))
                    .status();
            };
            kill("STOP", &[postmaster]);
            let mut doomed = vec![postmaster];
            doomed.extend(children_of(postmaster));
            kill("KILL", &doomed);
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The processes whose parent is `parent`, from /proc.
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = fs::read_to_string(entry.path().join("stat")).ok()?;
            // `pid (comm) state ppid ...`: the command may hold spaces and parentheses.
            let after = &stat[stat.rfind(')')? + 1..];
            let ppid: u32 = after.split_whitespace().nth(1)?.parse().ok()?;
            (ppid == parent).then_some(pid)
        })
        .collect()
}

impl Cluster {
    /// Creates the primary (initdb), starts it, makes the standby from it
    /// (`pg_basebackup -R` through the replication link, with a replication slot), starts
    /// it, waits until it streams (and, for [`Replication::Synchronous`], until it is the
    /// synchronous standby), and opens the clients' endpoint on the primary.
    pub async fn start(replication: Replication) -> Cluster {
        let bindir = find_pg_bindir().unwrap_or_else(|| {
            panic!(
                "PostgreSQL's server programs (initdb, pg_ctl, postgres, pg_basebackup) are not installed: \
                 run `scripts/services.sh up postgres` (as root it installs them)"
            )
        });
        let owner = server_owner();
        let dir = std::env::temp_dir().join(format!(
            "idem-failover-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        ));
        fs::create_dir_all(&dir).unwrap();
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
        }
        let primary_port = free_port();
        let primary_data = dir.join("primary");
        let standby_data = dir.join("standby");

        let mut initdb = Command::new(bindir.join("initdb"));
        initdb.arg("-D").arg(&primary_data).args([
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--no-locale",
            "--no-sync",
        ]);
        let initdb = run(owner, &dir, initdb).await;
        assert!(
            initdb.status.success(),
            "initdb failed: {}",
            output(&initdb)
        );

        let mut cluster = Cluster {
            dir: dir.clone(),
            bindir: bindir.clone(),
            owner,
            primary: Server {
                name: "primary",
                port: primary_port,
                child: None,
            },
            standby: Server {
                name: "standby",
                port: 0,
                child: None,
            },
            endpoint: Proxy::start(SocketAddr::from(([127, 0, 0, 1], primary_port))).unwrap(),
            link: Proxy::start(SocketAddr::from(([127, 0, 0, 1], primary_port))).unwrap(),
        };
        let child = cluster.spawn_server(&primary_data, primary_port, "primary");
        cluster.primary.child = Some(child);
        wait_accepting(&mut cluster.primary, START_LIMIT).await;

        let link_port = cluster.link.address().port().to_string();
        // Through the link: `-R` writes the link's port into the standby's
        // primary_conninfo, so that its replication connection crosses the link too.
        let mut basebackup = Command::new(bindir.join("pg_basebackup"));
        basebackup
            .args(["-h", "127.0.0.1", "-p", &link_port, "-U", "postgres", "-D"])
            .arg(&standby_data)
            .args([
                "-R",
                "-X",
                "stream",
                "-C",
                "-S",
                "failover_standby",
                "-c",
                "fast",
                "--no-sync",
            ]);
        let basebackup = run(owner, &dir, basebackup).await;
        assert!(
            basebackup.status.success(),
            "pg_basebackup failed: {}",
            output(&basebackup)
        );
        let standby_port = free_port();
        cluster.standby.port = standby_port;
        let child = cluster.spawn_server(&standby_data, standby_port, "standby");
        cluster.standby.child = Some(child);
        wait_accepting(&mut cluster.standby, START_LIMIT).await;

        let mut primary = cluster.connect(&cluster.primary, "postgres").await;
        if replication == Replication::Synchronous {
            // Set on the primary alone (postgresql.auto.conf is not replicated): once
            // promoted, the standby has no standby of its own to wait for.
            for statement in [
                "ALTER SYSTEM SET synchronous_standby_names = '*'",
                "SELECT pg_reload_conf()",
            ] {
                sqlx::raw_sql(statement)
                    .execute(&mut primary)
                    .await
                    .unwrap();
            }
        }
        let wanted = match replication {
            Replication::Synchronous => "sync",
            Replication::Asynchronous => "async",
        };
        let started = Instant::now();
        loop {
            let states: Vec<(String, String)> =
                sqlx::query_as("SELECT state, sync_state FROM pg_stat_replication")
                    .fetch_all(&mut primary)
                    .await
                    .unwrap();
            if states
                .iter()
                .any(|(state, sync)| state == "streaming" && sync == wanted)
            {
                break;
            }
            assert!(
                started.elapsed() < START_LIMIT,
                "the standby does not stream ({wanted}): {states:?}; logs in {}",
                cluster.dir.display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        primary.close().await.ok();
        cluster
    }

    /// Options for `database` through the clients' endpoint.
    pub fn options(&self, database: &str) -> PgConnectOptions {
        PgConnectOptions::new()
            .host("127.0.0.1")
            .port(self.endpoint.address().port())
            .username("postgres")
            .database(database)
    }

    /// Creates `database` on the primary and returns a [`pool`](Self::pool) on it.
    pub async fn database(&self, database: &str, connections: u32) -> PgPool {
        let mut admin = self.connect(&self.primary, "postgres").await;
        sqlx::raw_sql(&format!("CREATE DATABASE \"{database}\""))
            .execute(&mut admin)
            .await
            .unwrap();
        admin.close().await.ok();
        self.pool(database, connections).await
    }

    /// A pool on `database` through the endpoint, for the checks: patient (10 s to get a
    /// connection), connected at once.
    pub async fn pool(&self, database: &str, connections: u32) -> PgPool {
        PgPoolOptions::new()
            .max_connections(connections)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(self.options(database))
            .await
            .unwrap()
    }

    /// A pool on `database` through the endpoint, as a consumer process has: short
    /// timeouts (an outage shows as errors within a second or two), connecting on first
    /// use.
    pub fn client_pool(&self, database: &str, connections: u32) -> PgPool {
        PgPoolOptions::new()
            .max_connections(connections)
            .acquire_timeout(Duration::from_secs(2))
            .connect_lazy_with(self.options(database))
    }

    /// Waits until the standby has replayed everything the primary wrote so far.
    pub async fn wait_standby_caught_up(&self) {
        let mut primary = self.connect(&self.primary, "postgres").await;
        let target: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
            .fetch_one(&mut primary)
            .await
            .unwrap();
        let started = Instant::now();
        loop {
            let behind: Option<bool> = sqlx::query_scalar(
                "SELECT bool_and(replay_lsn < $1::pg_lsn) FROM pg_stat_replication",
            )
            .bind(&target)
            .fetch_one(&mut primary)
            .await
            .unwrap();
            if behind == Some(false) {
                break;
            }
            assert!(
                started.elapsed() < START_LIMIT,
                "the standby does not replay up to {target}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        primary.close().await.ok();
    }

    /// Stops the standby's replication traffic, both ways, leaving its connection hanging
    /// (a silent network): from now on, the standby falls behind.
    pub fn pause_replication(&self) {
        self.link.pause();
    }

    /// The failover: kills the primary (SIGKILL of the postmaster and its backends, as a
    /// machine dies), holds new client connections, promotes the standby (`pg_ctl
    /// promote`, then waits until `pg_is_in_recovery()` is false) and moves the endpoint
    /// to it, closing every client connection still open. Returns how long the clients had
    /// no server.
    pub async fn fail_over(&mut self) -> Duration {
        let started = Instant::now();
        self.primary.kill();
        self.endpoint.detach();
        self.link.detach();
        let mut promote = Command::new(self.bindir.join("pg_ctl"));
        promote
            .arg("promote")
            .arg("-D")
            .arg(self.dir.join("standby"))
            .args(["-w", "-t", "60"]);
        let promote = run(self.owner, &self.dir, promote).await;
        assert!(
            promote.status.success(),
            "pg_ctl promote failed: {}",
            output(&promote)
        );
        let mut standby = self.connect(&self.standby, "postgres").await;
        loop {
            let recovering: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()")
                .fetch_one(&mut standby)
                .await
                .unwrap();
            if !recovering {
                break;
            }
            assert!(
                started.elapsed() < START_LIMIT,
                "the standby is still in recovery after pg_ctl promote"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        standby.close().await.ok();
        self.endpoint.move_to(self.standby.address());
        started.elapsed()
    }

    async fn connect(&self, server: &Server, database: &str) -> PgConnection {
        PgConnection::connect_with(
            &PgConnectOptions::new()
                .host("127.0.0.1")
                .port(server.port)
                .username("postgres")
                .database(database),
        )
        .await
        .unwrap_or_else(|error| {
            panic!(
                "the {} on port {} refuses connections: {error}; its log: {}",
                server.name,
                server.port,
                self.dir.join(format!("{}.log", server.name)).display()
            )
        })
    }

    /// Starts `postgres` on `data` as the cluster's owner, logging to `<name>.log`.
    fn spawn_server(&self, data: &Path, port: u16, name: &str) -> Child {
        let log = fs::File::create(self.dir.join(format!("{name}.log"))).unwrap();
        let mut command = Command::new(self.bindir.join("postgres"));
        command
            .arg("-D")
            .arg(data)
            .arg("-c")
            .arg(format!("port={port}"))
            .args(["-c", "listen_addresses=127.0.0.1"])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", self.dir.display()))
            .args([
                // Speed over durability: the servers' own crashes are not what is tested
                // (a kill takes the processes, not the page cache).
                "-c",
                "fsync=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "synchronous_commit=on",
                "-c",
                "wal_level=replica",
                "-c",
                "max_wal_senders=5",
                "-c",
                "max_replication_slots=5",
                "-c",
                "hot_standby=on",
                "-c",
                "max_connections=300",
                "-c",
                "shared_buffers=64MB",
                // A standby whose link came back tries the primary again within a second.
                "-c",
                "wal_retrieve_retry_interval=1s",
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .current_dir(&self.dir);
        if let Some((uid, gid)) = self.owner {
            command.uid(uid).gid(gid);
        }
        command
            .spawn()
            .unwrap_or_else(|error| panic!("starting the {name} failed: {error}"))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.primary.kill();
        self.standby.kill();
        if std::thread::panicking() {
            // Kept for the post-mortem: the servers' logs.
            eprintln!("the failover cluster's files: {}", self.dir.display());
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// Waits until `server` accepts connections; panics if it exits or takes too long.
async fn wait_accepting(server: &mut Server, limit: Duration) {
    let started = Instant::now();
    let options = PgConnectOptions::new()
        .host("127.0.0.1")
        .port(server.port)
        .username("postgres")
        .database("postgres");
    loop {
        if let Ok(connection) = PgConnection::connect_with(&options).await {
            connection.close().await.ok();
            return;
        }
        if let Some(child) = server.child.as_mut()
            && let Ok(Some(status)) = child.try_wait()
        {
            panic!("the {} exited at start ({status})", server.name);
        }
        assert!(
            started.elapsed() < limit,
            "the {} does not accept connections after {limit:?}",
            server.name
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs a PostgreSQL program to its end as `owner` (when the test runs as root), from
/// `dir`, off the runtime's thread: the proxies it may connect through go on meanwhile.
async fn run(owner: Option<(u32, u32)>, dir: &Path, mut command: Command) -> std::process::Output {
    command.current_dir(dir).stdin(Stdio::null());
    if let Some((uid, gid)) = owner {
        command.uid(uid).gid(gid);
    }
    tokio::task::spawn_blocking(move || {
        command
            .output()
            .unwrap_or_else(|error| panic!("running {command:?} failed: {error}"))
    })
    .await
    .unwrap()
}

fn output(output: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// As root, the user and group the servers run as: `postgres` (the packages create it),
/// else `nobody`. `None` when the test does not run as root.
fn server_owner() -> Option<(u32, u32)> {
    // The owner of /proc/self is this process's effective user.
    let euid = fs::metadata("/proc/self").map(|meta| meta.uid()).ok()?;
    if euid != 0 {
        return None;
    }
    let passwd = fs::read_to_string("/etc/passwd").unwrap_or_default();
    let entry = |name: &str| {
        passwd.lines().find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            (fields.len() > 3 && fields[0] == name)
                .then(|| Some((fields[2].parse().ok()?, fields[3].parse().ok()?)))
                .flatten()
        })
    };
    Some(
        entry("postgres")
            .or_else(|| entry("nobody"))
            .expect("a user `postgres` or `nobody` to run PostgreSQL as (it refuses root)"),
    )
}

/// Where `initdb`, `pg_ctl`, `postgres` and `pg_basebackup` are: on `PATH`, or where the
/// packages of Debian, Ubuntu, Fedora or a source build put them; the highest version
/// wins (as `scripts/services.sh` chooses).
fn find_pg_bindir() -> Option<PathBuf> {
    let complete = |dir: &Path| {
        ["initdb", "pg_ctl", "postgres", "pg_basebackup"]
            .iter()
            .all(|program| dir.join(program).is_file())
    };
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).filter(|dir| complete(dir)));
    }
    for parent in ["/usr/lib/postgresql", "/usr"] {
        let Ok(entries) = fs::read_dir(parent) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let dir = if parent == "/usr" {
                if !name.starts_with("pgsql-") {
                    continue;
                }
                entry.path().join("bin")
            } else {
                entry.path().join("bin")
            };
            if complete(&dir) {
                candidates.push(dir);
            }
        }
    }
    let local = PathBuf::from("/usr/local/pgsql/bin");
    if complete(&local) {
        candidates.push(local);
    }
    candidates.into_iter().max_by_key(|dir| major_version(dir))
}

/// The major version of the `postgres` in `dir` (0 when it cannot be read).
fn major_version(dir: &Path) -> u32 {
    Command::new(dir.join("postgres"))
        .arg("--version")
        .output()
        .ok()
        .and_then(|output| {
            let text = String::from_utf8_lossy(&output.stdout).into_owned();
            let version = text.split_whitespace().last()?.to_owned();
            version.split('.').next()?.parse().ok()
        })
        .unwrap_or(0)
}

/// A port of 127.0.0.1 nobody listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .unwrap()
}
