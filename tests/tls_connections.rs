//! PostgreSQL and the Redis cache over TLS, with rustls (no system OpenSSL).
//!
//! The test makes a certificate authority and a server certificate for `localhost` and
//! 127.0.0.1 (rcgen), runs a private PostgreSQL cluster through `scripts/services.sh` (a
//! free port, a state folder of its own), and turns `ssl` on in it with that certificate.
//! Then:
//!
//! - an `#[idempotent]` handler runs end to end (new, duplicate) over a pool whose URL says
//!   `sslmode=verify-full&sslrootcert=<the CA>`, and the server reports the handler's own
//!   session as encrypted (`pg_stat_ssl`), as it does for a `verify-full` connection to
//!   `localhost`; a `sslmode=disable` session is reported as not encrypted;
//! - `verify-full` against another CA is refused, with an error that names the certificate;
//! - with the `redis` feature: a private `redis-server` that speaks only TLS, with the same
//!   certificate, is the handle's cache at a `rediss://` URL; a duplicate is answered from
//!   it while PostgreSQL is out of reach, and a client that trusts another CA is refused.
//!
//! Everything is stopped at the end, also when an assertion fails. Skipped, with the reason
//! printed, only where the server programs are missing and the script cannot install them
//! (it exits with status 3 then); the Redis part alone is skipped, with the reason printed,
//! where `redis-server` is missing or built without TLS.

use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use idem_demo::orders::OrderEvent;
use idem_runtime::testing::count_rows;
use idem_runtime::{Idem, Outcome, idempotent};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection, PgPool};

/// The script's exit status when a server program is missing and it cannot install it.
const EXIT_MISSING: i32 = 3;

/// What the handler stores and replays: its effect's row, and how the server saw the
/// handler's own session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    payment_id: i64,
    encrypted: bool,
    tls_version: Option<String>,
}

#[idempotent(key = "order_id", scope = "tls_pay")]
async fn pay(tx: &mut PgConnection, event: &OrderEvent) -> Result<Receipt, sqlx::Error> {
    let payment_id = fixtures::insert_effect(tx, event).await?;
    let (encrypted, tls_version) = session_tls(tx).await?;
    Ok(Receipt {
        payment_id,
        encrypted,
        tls_version,
    })
}

/// Whether the server sees this session as encrypted, and with which TLS version.
async fn session_tls(conn: &mut PgConnection) -> Result<(bool, Option<String>), sqlx::Error> {
    sqlx::query_as("SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(conn)
        .await
}

/// A certificate authority, a server certificate it signed for `localhost` and 127.0.0.1,
/// and a second, unrelated authority; PEM files in `dir`.
struct Pki {
    ca: PathBuf,
    other_ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
}

impl Pki {
    fn make(dir: &Path) -> Self {
        use rcgen::{
            BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
            IsCa, KeyPair, KeyUsagePurpose,
        };
        let authority = |name: &str| {
            let mut params = CertificateParams::new(Vec::new()).expect("CA parameters");
            params.distinguished_name.push(DnType::CommonName, name);
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
            CertifiedIssuer::self_signed(params, KeyPair::generate().expect("a CA key"))
                .expect("a self-signed CA")
        };
        let ca = authority("idem test CA");
        let other_ca = authority("idem test CA (another)");

        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
                .expect("server parameters");
        params
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let server_key = KeyPair::generate().expect("a server key");
        let server_cert = params
            .signed_by(&server_key, &ca)
            .expect("the server certificate");

        let pki = Pki {
            ca: dir.join("ca.crt"),
            other_ca: dir.join("other-ca.crt"),
            server_cert: dir.join("server.crt"),
            server_key: dir.join("server.key"),
        };
        std::fs::write(&pki.ca, ca.pem()).unwrap();
        std::fs::write(&pki.other_ca, other_ca.pem()).unwrap();
        std::fs::write(&pki.server_cert, server_cert.pem()).unwrap();
        write_private(&pki.server_key, &server_key.serialize_pem());
        pki
    }
}

/// Writes `content` to a new file at `path` readable by its owner only (0600).
fn write_private(path: &Path, content: &str) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .unwrap_or_else(|error| panic!("create {}: {error}", path.display()));
    file.write_all(content.as_bytes()).unwrap();
}

/// The test's folder (certificates, the script's state, Redis's log), and the services
/// started in it: `services.sh down` and removal of the folder on drop, so that a failing
/// test leaves nothing running either.
struct Workspace {
    dir: PathBuf,
    database_url: String,
}

impl Workspace {
    fn new(pg_port: u16) -> Self {
        let dir = std::env::temp_dir().join(format!("idem-tls-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the test's folder");
        Workspace {
            dir,
            database_url: format!("postgres://postgres@127.0.0.1:{pg_port}/postgres"),
        }
    }

    fn state(&self) -> PathBuf {
        self.dir.join("services")
    }

    fn services(&self, args: &[&str]) -> Output {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/services.sh");
        let output = Command::new("bash")
            .arg(script)
            .args(args)
            .env("IDEM_SERVICES_DIR", self.state())
            .env("DATABASE_URL", &self.database_url)
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

    /// The end of the private cluster's log.
    fn postgres_log(&self) -> String {
        let log = std::fs::read_to_string(self.state().join("postgres.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// `DATABASE_URL` with `query` appended.
    fn url(&self, host: &str, query: &str) -> String {
        format!("{}?{query}", self.database_url.replace("127.0.0.1", host))
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        if self.state().exists() {
            let _ = self.services(&["down"]);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A loopback port where nothing listens, below the usual ephemeral range (32768 and up),
/// so that no outgoing connection takes it while the script runs `initdb`.
fn free_port() -> u16 {
    let offset = u16::try_from((std::process::id() * 7) % 10_000).unwrap();
    (20_000 + offset..32_768)
        .chain(20_000..20_000 + offset)
        .find(|port| TcpListener::bind(("127.0.0.1", *port)).is_ok() && !listening(*port))
        .expect("a free port")
}

fn listening(port: u16) -> bool {
    TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(1)).is_ok()
}

/// Puts the server certificate and key into the cluster's data directory, owned by the
/// cluster's user (as root, the script runs it as an unprivileged user) with the key at
/// 0600, turns `ssl` on and reloads; returns once a `sslmode=require` session works.
async fn enable_ssl(workspace: &Workspace, pki: &Pki) {
    let mut admin = PgConnection::connect(&workspace.url("127.0.0.1", "sslmode=disable"))
        .await
        .expect("connect to the private cluster");
    let data: String = sqlx::query_scalar("SELECT current_setting('data_directory')")
        .fetch_one(&mut admin)
        .await
        .unwrap();
    let data = PathBuf::from(data);
    let owner = std::fs::metadata(&data).expect("the data directory").uid();
    let group = std::fs::metadata(&data).unwrap().gid();
    for (from, name) in [
        (&pki.server_cert, "server.crt"),
        (&pki.server_key, "server.key"),
    ] {
        let to = data.join(name);
        let _ = std::fs::remove_file(&to);
        write_private(&to, &std::fs::read_to_string(from).unwrap());
        if std::fs::metadata(&to).unwrap().uid() != owner {
            std::os::unix::fs::chown(&to, Some(owner), Some(group))
                .unwrap_or_else(|error| panic!("chown {}: {error}", to.display()));
        }
    }
    for statement in [
        "ALTER SYSTEM SET ssl_cert_file = 'server.crt'",
        "ALTER SYSTEM SET ssl_key_file = 'server.key'",
        "ALTER SYSTEM SET ssl = on",
        "SELECT pg_reload_conf()",
    ] {
        sqlx::raw_sql(statement)
            .execute(&mut admin)
            .await
            .unwrap_or_else(|error| panic!("{statement}: {error}"));
    }
    admin.close().await.unwrap();

    // The postmaster reloads asynchronously; a bad certificate or key leaves ssl off.
    let deadline = Instant::now() + Duration::from_secs(10);
    let url = workspace.url("127.0.0.1", "sslmode=require");
    loop {
        match PgConnection::connect(&url).await {
            Ok(conn) => {
                conn.close().await.unwrap();
                return;
            }
            Err(error) if Instant::now() > deadline => panic!(
                "ssl = on did not take effect: {error}\nthe end of the cluster's log:\n{}",
                workspace.postgres_log()
            ),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

#[tokio::test]
async fn postgres_and_redis_over_tls_with_a_private_ca() {
    let started = Instant::now();
    let workspace = Workspace::new(free_port());
    let pki = Pki::make(&workspace.dir);

    let up = workspace.services(&["up", "postgres"]);
    if up.status.code() == Some(EXIT_MISSING) {
        println!(
            "skipped: PostgreSQL's server programs are missing and scripts/services.sh cannot install them here:\n{}",
            String::from_utf8_lossy(&up.stderr)
        );
        return;
    }
    assert!(up.status.success(), "services.sh up postgres failed");
    let cluster_up = started.elapsed();
    enable_ssl(&workspace, &pki).await;
    println!(
        "private cluster up in {cluster_up:.1?}, ssl on after {:.1?}",
        started.elapsed()
    );

    // An #[idempotent] handler over a verify-full pool: the client checks the server's
    // certificate against the test's CA, and the host name against the certificate.
    let tls_url = workspace.url(
        "127.0.0.1",
        &format!("sslmode=verify-full&sslrootcert={}", pki.ca.display()),
    );
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(&tls_url)
        .await
        .expect("a verify-full pool with the test's CA");
    let idem = fixtures::setup(&pool).await;
    let event = fixtures::paid("o-tls", 4_200);
    let Outcome::Executed(receipt) = pay(&idem, &event).await.expect("the first delivery") else {
        panic!("the first delivery executes");
    };
    assert!(
        receipt.encrypted,
        "the handler's session is not encrypted: {receipt:?}"
    );
    let version = receipt.tls_version.clone().unwrap_or_default();
    assert!(version.starts_with("TLSv1."), "{version}");
    assert_eq!(
        pay(&idem, &event).await.expect("the duplicate"),
        Outcome::Duplicate(Some(receipt.clone()))
    );
    assert_eq!(count_rows(&pool, "order_effects").await, 1);
    let key = idem_runtime::key::KeyBuilder::new()
        .part("order_id", &event.order_id)
        .unwrap()
        .finish();
    let record = idem
        .record("tls_pay", key)
        .await
        .unwrap()
        .expect("a record");
    assert_eq!(record.status, idem_runtime::Status::Success);
    println!("handler over TLS: {receipt:?}");

    // The certificate's DNS name verifies too; a plain session is reported as such.
    let localhost_url = workspace.url(
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={}", pki.ca.display()),
    );
    let mut conn = PgConnection::connect(&localhost_url)
        .await
        .expect("verify-full to localhost");
    assert!(session_tls(&mut conn).await.unwrap().0, "not encrypted");
    conn.close().await.unwrap();
    let mut plain = PgConnection::connect(&workspace.url("127.0.0.1", "sslmode=disable"))
        .await
        .unwrap();
    assert_eq!(session_tls(&mut plain).await.unwrap(), (false, None));
    plain.close().await.unwrap();

    // verify-full refuses a server whose certificate another CA signed.
    let wrong_url = workspace.url(
        "127.0.0.1",
        &format!("sslmode=verify-full&sslrootcert={}", pki.other_ca.display()),
    );
    let refused = PgConnection::connect(&wrong_url)
        .await
        .expect_err("a certificate of another CA is refused");
    println!("verify-full with another CA: {refused}");
    // sqlx reports it as an I/O error whose text names the certificate and the reason.
    let message = refused.to_string();
    assert!(
        message.contains("invalid peer certificate") && message.contains("UnknownIssuer"),
        "{refused:?}"
    );

    #[cfg(feature = "redis")]
    redis_over_tls::cache_over_tls(&workspace, &pki, &tls_url, &event).await;
    #[cfg(not(feature = "redis"))]
    println!("the Redis part needs the `redis` feature (cargo test --all-features)");

    pool.close().await;
    drop(workspace);
    println!("whole test, services stopped: {:.1?}", started.elapsed());
}

#[cfg(feature = "redis")]
mod redis_over_tls {
    use std::process::{Child, Stdio};

    use idem_runtime::cache::RedisCache;
    use idem_runtime::cache::redis::{self, TlsCertificates};

    use super::*;

    /// A `redis-server` that speaks only TLS (no plain port), on a free port of 127.0.0.1,
    /// without persistence. Killed when dropped.
    struct TlsRedis {
        port: u16,
        child: Child,
        log: PathBuf,
    }

    impl TlsRedis {
        /// Starts it with the test's server certificate, or says why it cannot run here.
        async fn start(workspace: &Workspace, pki: &Pki) -> Result<Self, String> {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|listener| listener.local_addr())
                .expect("a free port")
                .port();
            let log = workspace.dir.join("redis.log");
            let child = Command::new("redis-server")
                .args(["--port", "0", "--tls-port", &port.to_string()])
                .args(["--bind", "127.0.0.1", "--tls-auth-clients", "no"])
                .arg("--tls-cert-file")
                .arg(&pki.server_cert)
                .arg("--tls-key-file")
                .arg(&pki.server_key)
                .arg("--tls-ca-cert-file")
                .arg(&pki.ca)
                .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
                .arg("--dir")
                .arg(&workspace.dir)
                .arg("--logfile")
                .arg(&log)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|error| format!("redis-server cannot be started ({error})"))?;
            let mut server = TlsRedis { port, child, log };
            let deadline = Instant::now() + Duration::from_secs(10);
            while !listening(port) {
                if let Some(status) = server.child.try_wait().expect("wait for redis-server") {
                    let mut said = std::fs::read_to_string(&server.log).unwrap_or_default();
                    if let Some(mut stderr) = server.child.stderr.take() {
                        use std::io::Read;
                        let _ = stderr.read_to_string(&mut said);
                    }
                    let lower = said.to_lowercase();
                    // Built without TLS: the tls-* options are unknown (or said to be
                    // unsupported). A certificate it cannot load is the test's failure.
                    let unsupported = lower.contains("not supported")
                        || lower.contains("not built")
                        || lower.contains("bad directive");
                    if lower.contains("tls") && unsupported {
                        return Err(format!(
                            "this redis-server has no TLS support ({status}): {}",
                            said.trim()
                        ));
                    }
                    panic!("redis-server stopped ({status}): {said}");
                }
                assert!(Instant::now() < deadline, "redis-server does not listen");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(server)
        }

        fn url(&self) -> String {
            format!("rediss://127.0.0.1:{}", self.port)
        }
    }

    impl Drop for TlsRedis {
        fn drop(&mut self) {
            self.child.kill().ok();
            self.child.wait().ok();
        }
    }

    /// A client of `url` that trusts the CA in `ca` only.
    fn client(url: &str, ca: &Path) -> redis::Client {
        redis::Client::build_with_tls(
            url,
            TlsCertificates {
                client_tls: None,
                root_cert: Some(std::fs::read(ca).expect("the CA's PEM")),
            },
        )
        .expect("a rediss:// client")
    }

    /// The handle's cache on a TLS-only Redis answers a duplicate while PostgreSQL is out of
    /// reach; a client that trusts another CA is refused.
    pub(super) async fn cache_over_tls(
        workspace: &Workspace,
        pki: &Pki,
        database_url: &str,
        first: &OrderEvent,
    ) {
        let started = Instant::now();
        let redis = match TlsRedis::start(workspace, pki).await {
            Ok(redis) => redis,
            Err(reason) => {
                println!("skipped the Redis part: {reason}");
                return;
            }
        };
        let url = redis.url();
        // Without TLS compiled into the redis crate, a rediss:// URL is refused right here.
        RedisCache::from_url(&url).expect("rediss:// URLs are supported");

        let refused = client(&url, &pki.other_ca)
            .get_multiplexed_async_connection()
            .await
            .expect_err("a certificate of another CA is refused");
        println!("rediss:// with another CA: {refused}");
        assert!(refused.to_string().contains("UnknownIssuer"), "{refused}");

        // A handle of its own, on a pool of its own that is closed after the first delivery.
        let pool = PgPool::connect(database_url).await.expect("a TLS pool");
        let cache = RedisCache::new(client(&url, &pki.ca))
            .prefix(format!("idem-tls-test:{}:", uuid::Uuid::new_v4().simple()))
            .timeout(Duration::from_secs(2));
        let idem = Idem::builder(pool.clone())
            .redis(cache)
            .build()
            .expect("valid settings");
        let event = fixtures::paid("o-tls-cached", 900);
        let Outcome::Executed(receipt) = pay(&idem, &event).await.expect("the first delivery")
        else {
            panic!("the first delivery executes");
        };
        // The write runs in the background, right after the delivery returns.
        let deadline = Instant::now() + Duration::from_secs(5);
        while idem.cache_stats().unwrap().writes < 1 {
            let stats = idem.cache_stats().unwrap();
            assert!(Instant::now() < deadline, "no cache write: {stats:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

        // From here on, PostgreSQL cannot answer: the duplicate comes from Redis over TLS.
        pool.close().await;
        assert_eq!(
            pay(&idem, &event).await.expect("the duplicate, from Redis"),
            Outcome::Duplicate(Some(receipt))
        );
        let stats = idem.cache_stats().unwrap();
        assert_eq!(
            (stats.hits, stats.errors, stats.forged),
            (1, 0, 0),
            "{stats:?}"
        );
        // The key that PostgreSQL alone knows (not cached) fails: the pool is really closed.
        assert!(pay(&idem, first).await.is_err());
        println!("Redis over TLS: {stats:?} in {:.1?}", started.elapsed());
        drop(redis);
    }
}
