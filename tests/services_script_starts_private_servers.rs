//! `scripts/services.sh` with the usual servers hidden from it (`DATABASE_URL` and
//! `REDIS_URL` on free loopback ports, a state folder of its own) runs a private PostgreSQL
//! cluster and a private Redis, and `up pgbouncer` a session and a transaction PgBouncer in
//! front of that cluster: they come up, answer, are reused by a second `up`, and
//! `services.sh down` stops them with nothing left running. A server that refuses an
//! explicit URL gets a message that says so, and no private server.
//!
//! Skipped, with the reason printed, only where the server programs are missing and the
//! script cannot install them (it exits with status 3 then); without PgBouncer, only its
//! part is skipped.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use sqlx::{Connection, PgConnection, Row};

/// The script's exit status when a server program is missing and it cannot install it.
const EXIT_MISSING: i32 = 3;

/// A state folder of its own and the URLs given to the script; `down` and removal of the
/// folder on drop, so that a failing test leaves nothing running either.
struct Services {
    state: PathBuf,
    database_url: String,
    redis_url: String,
}

impl Services {
    fn new(name: &str, database_url: String, redis_url: String) -> Self {
        let state =
            std::env::temp_dir().join(format!("idem-services-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&state);
        Services {
            state,
            database_url,
            redis_url,
        }
    }

    fn run(&self, args: &[&str]) -> Output {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/services.sh");
        let output = Command::new("bash")
            .arg(script)
            .args(args)
            .env("IDEM_SERVICES_DIR", &self.state)
            .env("DATABASE_URL", &self.database_url)
            .env("REDIS_URL", &self.redis_url)
            .env_remove("REDIS_PORT")
            .env_remove("KAFKA_PORT")
            .output()
            .expect("run scripts/services.sh");
        println!(
            "$ services.sh {} -> {}\n{}{}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        output
    }

    /// The state folder as the script names it (symbolic links resolved).
    fn state(&self) -> PathBuf {
        self.state.canonicalize().expect("the state folder exists")
    }
}

impl Drop for Services {
    fn drop(&mut self) {
        if self.state.exists() {
            let _ = self.run(&["down"]);
            let _ = std::fs::remove_dir_all(&self.state);
        }
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Two loopback ports where nothing listens, below the usual ephemeral range (32768 and
/// up), so that no outgoing connection takes one while the script runs `initdb`.
fn free_ports() -> (u16, u16) {
    let offset = u16::try_from(std::process::id() % 10_000).unwrap();
    let mut free = (20_000 + offset..32_768)
        .chain(20_000..20_000 + offset)
        .filter(|port| TcpListener::bind(("127.0.0.1", *port)).is_ok() && !listening(*port));
    let first = free.next().expect("a free port");
    let second = free.next().expect("a second free port");
    (first, second)
}

fn listening(port: u16) -> bool {
    TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(1)).is_ok()
}

/// The first line of Redis's answer to `PING`.
fn redis_ping(port: u16) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to Redis");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream.write_all(b"PING\r\n").unwrap();
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).unwrap();
    line.trim_end().to_owned()
}

/// The first line of a pid file.
fn pid_in(path: &Path) -> u32 {
    let content = std::fs::read_to_string(path)
        .unwrap_or_else(|error| panic!("read {}: {error}", path.display()));
    content
        .lines()
        .next()
        .and_then(|line| line.trim().parse().ok())
        .unwrap_or_else(|| panic!("no pid in {}", path.display()))
}

/// Whether process `pid` is gone (or a zombie waiting to be reaped) within 10 seconds
/// (Linux: from /proc). `pg_ctl stop` returns once the server removed its pid file, a
/// moment before the process ends.
fn exits(pid: u32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return true,
            // pid (comm) state ...: the state follows the last ')'.
            Ok(stat)
                if stat
                    .rsplit(')')
                    .next()
                    .is_some_and(|rest| rest.trim_start().starts_with('Z')) =>
            {
                return true;
            }
            Ok(_) if Instant::now() > deadline => return false,
            Ok(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Processes whose command line names `path` (Linux: from /proc).
fn processes_naming(path: &Path) -> Vec<String> {
    let needle = path.to_string_lossy().into_owned();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|entry| std::fs::read(entry.path().join("cmdline")).ok())
        .filter(|cmdline| !cmdline.is_empty()) // zombies
        .map(|cmdline| text(&cmdline).replace('\0', " "))
        .filter(|cmdline| cmdline.contains(&needle))
        .collect()
}

#[tokio::test]
async fn services_script_starts_private_postgres_and_redis_and_stops_them() {
    let (pg_port, redis_port) = free_ports();
    let database_url = format!("postgres://postgres@127.0.0.1:{pg_port}/postgres");
    let redis_url = format!("redis://127.0.0.1:{redis_port}");
    let services = Services::new("private", database_url.clone(), redis_url.clone());

    // Up: both are started, and the URLs to use are printed for `eval`.
    let started = Instant::now();
    let up = services.run(&["up", "--print-env", "postgres", "redis"]);
    let up_time = started.elapsed();
    if up.status.code() == Some(EXIT_MISSING) {
        println!(
            "skipped: the server programs are missing and scripts/services.sh cannot install them here:\n{}",
            text(&up.stderr)
        );
        return;
    }
    assert!(up.status.success(), "services.sh up failed");
    let (stdout, stderr) = (text(&up.stdout), text(&up.stderr));
    assert_eq!(
        stdout,
        format!("export DATABASE_URL={database_url}\nexport REDIS_URL={redis_url}\n"),
        "stdout holds the export lines only"
    );
    assert!(
        stderr.contains(&format!(
            "private cluster running at 127.0.0.1:{pg_port} (started"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "redis: running at 127.0.0.1:{redis_port} (started"
        )),
        "{stderr}"
    );
    println!("services.sh up (initdb, private cluster and Redis started) took {up_time:.1?}");

    // They answer: the PostgreSQL at the URL is the private cluster in the state folder.
    let cluster = services.state().join("postgres");
    let mut conn = PgConnection::connect(&database_url)
        .await
        .expect("connect to the private cluster");
    let data_directory: String = sqlx::query_scalar("SELECT current_setting('data_directory')")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(Path::new(&data_directory), cluster);
    let listen: String = sqlx::query_scalar("SELECT current_setting('listen_addresses')")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(listen, "127.0.0.1", "loopback only");
    conn.close().await.unwrap();
    assert_eq!(redis_ping(redis_port), "+PONG");

    // PgBouncer: `up pgbouncer` (postgres implied) runs a session and a transaction pooler
    // in front of the private cluster and prints their URLs after DATABASE_URL's.
    let up = services.run(&["up", "--print-env", "pgbouncer"]);
    let poolers = if up.status.code() == Some(EXIT_MISSING) {
        println!(
            "PgBouncer part skipped: pgbouncer is missing and scripts/services.sh cannot install it here:\n{}",
            text(&up.stderr)
        );
        None
    } else {
        assert!(up.status.success(), "services.sh up pgbouncer failed");
        Some(check_poolers(&text(&up.stdout), &database_url, &cluster).await)
    };

    // A second `up` reuses all of them.
    let mut args = vec!["up", "postgres", "redis"];
    if poolers.is_some() {
        args.push("pgbouncer");
    }
    let again = services.run(&args);
    assert!(again.status.success());
    let stdout = text(&again.stdout);
    if let Some(poolers) = &poolers {
        for (mode, port) in poolers {
            assert!(
                stdout.contains(&format!(
                    "pgbouncer: {mode} pooler running at 127.0.0.1:{port} in front of 127.0.0.1:{pg_port} (reused"
                )),
                "{stdout}"
            );
        }
    }
    assert!(
        stdout.contains(&format!(
            "private cluster running at 127.0.0.1:{pg_port} (reused"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("redis: running at 127.0.0.1:{redis_port} (reused")),
        "{stdout}"
    );
    let status = text(&services.run(&["status"]).stdout);
    assert!(status.contains("running (private cluster in"), "{status}");
    if let Some(poolers) = &poolers {
        for (mode, port) in poolers {
            assert!(
                status.contains(&format!(
                    "pgbouncer: 127.0.0.1:{port}  pool_mode={mode}, running (started by this script)"
                )),
                "{status}"
            );
        }
    }

    // An explicit URL that the server refuses is an error that says so, with what to do;
    // no private server is started for it.
    let refused = Services::new(
        "refused",
        format!("postgres://no_such_role@127.0.0.1:{pg_port}/postgres"),
        format!("redis://127.0.0.1:{pg_port}"),
    );
    let output = refused.run(&["up", "postgres"]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("refuses DATABASE_URL's connection") && stderr.contains("no_such_role"),
        "{stderr}"
    );
    assert!(stderr.contains("unset DATABASE_URL"), "{stderr}");
    let output = refused.run(&["up", "redis"]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("does not accept Redis's PING"), "{stderr}");
    assert!(!refused.state().join("postgres").exists());
    assert!(!refused.state().join("redis.pid").exists());
    drop(refused);

    // Down stops all of them; nothing is left running.
    let postmaster = pid_in(&cluster.join("postmaster.pid"));
    let redis = pid_in(&services.state().join("redis.pid"));
    let bouncers: Vec<u32> = poolers
        .iter()
        .flatten()
        .map(|(mode, _)| {
            pid_in(
                &services
                    .state()
                    .join(format!("pgbouncer-{mode}/pgbouncer.pid")),
            )
        })
        .collect();
    let started = Instant::now();
    let down = services.run(&["down"]);
    let down_time = started.elapsed();
    assert!(down.status.success());
    let stdout = text(&down.stdout);
    assert!(
        stdout.contains(&format!("stopped the private cluster on port {pg_port}")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("redis: stopped (pid {redis})")),
        "{stdout}"
    );
    for (pid, (mode, port)) in bouncers.iter().zip(poolers.iter().flatten()) {
        assert!(
            stdout.contains(&format!("pgbouncer: stopped the {mode} pooler (pid {pid})")),
            "{stdout}"
        );
        assert!(
            !listening(*port),
            "PgBouncer ({mode}) still listens on {port}"
        );
    }
    println!("services.sh down took {down_time:.1?}");
    assert!(!listening(pg_port), "PostgreSQL still listens on {pg_port}");
    assert!(
        !listening(redis_port),
        "Redis still listens on {redis_port}"
    );
    if Path::new("/proc/self").exists() {
        assert!(
            exits(postmaster),
            "the postmaster (pid {postmaster}) still runs"
        );
        assert!(exits(redis), "Redis (pid {redis}) still runs");
        for pid in &bouncers {
            assert!(exits(*pid), "PgBouncer (pid {pid}) still runs");
        }
        let left = processes_naming(&services.state());
        assert!(left.is_empty(), "still running: {left:?}");
    }
    let status = text(&services.run(&["status"]).stdout);
    let mut stopped = vec!["postgres:", "redis:"];
    if poolers.is_some() {
        stopped.push("pgbouncer:");
    }
    for service in stopped {
        assert!(
            status
                .lines()
                .any(|line| line.starts_with(service) && line.ends_with("not running")),
            "{status}"
        );
    }
}

/// The pool modes that `up pgbouncer` starts, with the port of each.
type Poolers = Vec<(&'static str, u16)>;

/// Checks what `up --print-env pgbouncer` printed: DATABASE_URL, then a URL per pooler with
/// its user and database; through each, sqlx reaches the private cluster (so PgBouncer takes
/// sqlx's startup parameters), and the admin console reports the pooler's settings.
async fn check_poolers(stdout: &str, database_url: &str, cluster: &Path) -> Poolers {
    let mut lines = stdout.lines();
    assert_eq!(
        lines.next(),
        Some(format!("export DATABASE_URL={database_url}").as_str()),
        "{stdout}"
    );
    let mut poolers = Poolers::new();
    for (mode, name) in [
        ("session", "IDEM_PGBOUNCER_SESSION_URL"),
        ("transaction", "IDEM_PGBOUNCER_TRANSACTION_URL"),
    ] {
        let line = lines.next().unwrap_or_default();
        let url = line
            .strip_prefix(&format!("export {name}="))
            .unwrap_or_else(|| panic!("no {name} in:\n{stdout}"));
        let port: u16 = url
            .strip_prefix("postgres://postgres@127.0.0.1:")
            .and_then(|rest| rest.strip_suffix("/postgres"))
            .and_then(|port| port.parse().ok())
            .unwrap_or_else(|| {
                panic!("{name}={url}: not DATABASE_URL's user and database on a loopback port")
            });
        assert!(poolers.iter().all(|(_, other)| *other != port), "{stdout}");

        // The simple query protocol: a prepared statement lives on the server connection
        // that prepared it, and PgBouncer 1.18 in transaction mode may run the next
        // statement on another one.
        let mut conn = PgConnection::connect(url)
            .await
            .unwrap_or_else(|error| panic!("connect through the {mode} pooler: {error}"));
        let row = sqlx::raw_sql("SELECT current_setting('data_directory')")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        let data_directory: String = row.get(0);
        assert_eq!(Path::new(&data_directory), cluster, "{mode} pooler");
        conn.close().await.unwrap();

        // The admin console: SHOW CONFIG as DATABASE_URL's user.
        let admin = format!("postgres://postgres@127.0.0.1:{port}/pgbouncer");
        let mut conn = PgConnection::connect(&admin).await.unwrap_or_else(|error| {
            panic!("connect to the {mode} pooler's admin console: {error}")
        });
        let config: Vec<(String, String)> = sqlx::raw_sql("SHOW CONFIG")
            .fetch_all(&mut conn)
            .await
            .unwrap()
            .iter()
            .map(|row| {
                (
                    row.get(0),
                    row.get::<Option<String>, _>(1).unwrap_or_default(),
                )
            })
            .collect();
        let setting = |key: &str| {
            config
                .iter()
                .find(|(name, _)| name == key)
                .map(|(_, value)| value.as_str())
                .unwrap_or_else(|| panic!("no {key} in SHOW CONFIG: {config:?}"))
        };
        assert_eq!(setting("pool_mode"), mode);
        assert_eq!(setting("listen_port"), port.to_string());
        assert_eq!(setting("listen_addr"), "127.0.0.1");
        assert_eq!(setting("default_pool_size"), "8");
        assert_eq!(setting("ignore_startup_parameters"), "extra_float_digits");
        conn.close().await.unwrap();
        poolers.push((mode, port));
    }
    assert_eq!(lines.next(), None, "{stdout}");
    poolers
}
