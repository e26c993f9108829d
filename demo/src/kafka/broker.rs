//! A local Kafka-API broker for the tests: the running one is reused, otherwise `tansu`
//! is started on a free loopback port and stopped again when the handle is dropped.
//!
//! `scripts/services.sh kafka` does the same for the demo and the examples, on the usual
//! port 9092, and installs `tansu` when it is missing.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The command that installs the broker (about 12 minutes on 2 cores).
pub const TANSU_INSTALL: &str = "cargo install tansu --version 0.6.0 --locked --features libsql";

/// The broker address the examples use by default.
pub const DEFAULT_ADDRESS: &str = "127.0.0.1:9092";

/// Why no broker could be provided.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// No broker runs and `tansu` is not installed.
    #[error(
        "no Kafka-API broker is running at {DEFAULT_ADDRESS} and the `tansu` broker is not installed.\n\
         Install it with `{TANSU_INSTALL}` (about 12 minutes on 2 cores), \
         or run `scripts/services.sh kafka` (which installs and starts it), \
         or set KAFKA_BROKERS to a running Kafka-API broker"
    )]
    NotInstalled,
    /// `tansu` was found but did not start.
    #[error("`{binary}` did not start: {reason}; its log: {log}")]
    DidNotStart {
        /// The binary.
        binary: PathBuf,
        /// What went wrong.
        reason: String,
        /// Its log file.
        log: PathBuf,
    },
    /// Starting it failed at the operating-system level.
    #[error("starting tansu failed: {0}")]
    Io(#[from] std::io::Error),
}

/// A broker for the duration of a test.
#[derive(Debug)]
pub struct LocalBroker {
    brokers: String,
    child: Option<Child>,
    dir: Option<PathBuf>,
}

impl LocalBroker {
    /// `KAFKA_BROKERS` when it is set; else the broker at 127.0.0.1:9092 when one answers;
    /// else a fresh `tansu` (sqlite storage in a temporary directory) on a free loopback
    /// port. Fails, saying how to install it, when `tansu` is not installed.
    pub fn ensure() -> Result<Self, BrokerError> {
        if let Ok(brokers) = std::env::var("KAFKA_BROKERS")
            && !brokers.trim().is_empty()
        {
            return Ok(LocalBroker {
                brokers,
                child: None,
                dir: None,
            });
        }
        let default: SocketAddr = DEFAULT_ADDRESS.parse().expect("a socket address");
        if TcpStream::connect_timeout(&default, Duration::from_millis(500)).is_ok() {
            return Ok(LocalBroker {
                brokers: DEFAULT_ADDRESS.to_owned(),
                child: None,
                dir: None,
            });
        }
        let binary = find_tansu().ok_or(BrokerError::NotInstalled)?;
        Self::start(&binary)
    }

    /// A fresh `tansu` of its own (sqlite storage in a temporary directory, thrown away
    /// with it) on a free loopback port: for a benchmark that writes many records, which
    /// would slow the shared broker down for the tests that follow (its sqlite storage
    /// grows with every record).
    pub fn private() -> Result<Self, BrokerError> {
        let binary = find_tansu().ok_or(BrokerError::NotInstalled)?;
        Self::start(&binary)
    }

    /// Starts `binary` on a free loopback port with its sqlite storage engine.
    fn start(binary: &Path) -> Result<Self, BrokerError> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let dir = std::env::temp_dir().join(format!("idem-tansu-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let log = dir.join("tansu.log");
        let url = format!("tcp://127.0.0.1:{port}");
        // The sqlite path is relative to the working directory.
        let child = Command::new(binary)
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
            ])
            .args(["--storage-engine", "sqlite://tansu.db"])
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log)?)
            .stderr(std::fs::File::create(dir.join("tansu.err"))?)
            .spawn()?;
        let mut broker = LocalBroker {
            brokers: format!("127.0.0.1:{port}"),
            child: Some(child),
            dir: Some(dir),
        };
        let address: SocketAddr = broker.brokers.parse().expect("a socket address");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_ok() {
                return Ok(broker);
            }
            let exited = broker
                .child
                .as_mut()
                .and_then(|child| child.try_wait().ok().flatten());
            if exited.is_some() || Instant::now() >= deadline {
                let reason = match exited {
                    Some(status) => format!("it exited with {status}"),
                    None => "it did not listen within 30 s".to_owned(),
                };
                return Err(BrokerError::DidNotStart {
                    binary: binary.to_owned(),
                    reason,
                    log,
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The bootstrap servers to give clients.
    pub fn brokers(&self) -> &str {
        &self.brokers
    }

    /// Whether this handle started the broker (and stops it when dropped).
    pub fn started_here(&self) -> bool {
        self.child.is_some()
    }
}

impl Drop for LocalBroker {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().ok();
            child.wait().ok();
        }
        if let Some(dir) = self.dir.take() {
            std::fs::remove_dir_all(dir).ok();
        }
    }
}

/// `tansu` on the `PATH`, or in cargo's install directory.
pub fn find_tansu() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>());
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cargo")))
        .map(|home| home.join("bin"));
    on_path
        .chain(cargo_home)
        .map(|dir| dir.join("tansu"))
        .find(|binary| binary.is_file())
}
