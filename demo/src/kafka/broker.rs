//! A local Kafka-API broker for the tests: the running one is reused, otherwise `tansu`
//! is started on a free loopback port and stopped again when the handle is dropped.
//!
//! A broker this handle started can also be killed and started again
//! ([`LocalBroker::kill`], [`LocalBroker::restart`]): on the same port and the same
//! sqlite storage, which is kept until the handle is dropped. That is how a test takes the
//! broker away from running clients and gives it back with its topics, records, committed
//! offsets and consumer groups.
//!
//! `scripts/services.sh kafka` does the same for the demo and the examples, on the usual
//! port 9092, and installs `tansu` when it is missing.

use std::fs::OpenOptions;
use std::io::Write;
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
    /// The broker was not started by this handle (`KAFKA_BROKERS`, or the one running at
    /// the default address), so it cannot be killed or restarted through it.
    #[error(
        "the broker at {brokers} was not started by this handle; \
         only a broker of its own (LocalBroker::private) can be killed and restarted"
    )]
    NotStartedHere {
        /// Its address.
        brokers: String,
    },
    /// Starting it failed at the operating-system level.
    #[error("starting tansu failed: {0}")]
    Io(#[from] std::io::Error),
}

/// What a handle needs to start its broker again: the binary, the port and the storage
/// directory (the working directory of `tansu`, which holds `tansu.db`).
#[derive(Debug)]
struct Launch {
    binary: PathBuf,
    port: u16,
    dir: PathBuf,
    /// How many times the broker was started (the first start counts).
    starts: u32,
}

/// A broker for the duration of a test.
///
/// When the handle started the broker ([`started_here`](Self::started_here)), dropping it
/// kills the broker and removes its storage directory.
#[derive(Debug)]
pub struct LocalBroker {
    brokers: String,
    child: Option<Child>,
    launch: Option<Launch>,
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
                launch: None,
            });
        }
        let default: SocketAddr = DEFAULT_ADDRESS.parse().expect("a socket address");
        if TcpStream::connect_timeout(&default, Duration::from_millis(500)).is_ok() {
            return Ok(LocalBroker {
                brokers: DEFAULT_ADDRESS.to_owned(),
                child: None,
                launch: None,
            });
        }
        let binary = find_tansu().ok_or(BrokerError::NotInstalled)?;
        Self::start(&binary)
    }

    /// A fresh `tansu` of its own (sqlite storage in a temporary directory, thrown away
    /// with it) on a free loopback port: for a benchmark that writes many records, which
    /// would slow the shared broker down for the tests that follow (its sqlite storage
    /// grows with every record), and for a test that kills and restarts the broker
    /// ([`kill`](Self::kill), [`restart`](Self::restart)).
    pub fn private() -> Result<Self, BrokerError> {
        let binary = find_tansu().ok_or(BrokerError::NotInstalled)?;
        Self::start(&binary)
    }

    /// Starts `binary` on a free loopback port with its sqlite storage engine.
    fn start(binary: &Path) -> Result<Self, BrokerError> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let dir = std::env::temp_dir().join(format!("idem-tansu-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let mut broker = LocalBroker {
            brokers: format!("127.0.0.1:{port}"),
            child: None,
            launch: Some(Launch {
                binary: binary.to_owned(),
                port,
                dir,
                starts: 0,
            }),
        };
        if let Err(error) = broker.launch(Duration::from_secs(30)) {
            // Keep the directory: the error names the log in it.
            broker.launch = None;
            return Err(error);
        }
        Ok(broker)
    }

    /// Kills the broker as a crash would (SIGKILL: no clean shutdown, open connections
    /// are reset) and waits until it has exited. Its storage directory stays, so
    /// [`restart`](Self::restart) brings the broker back with its topics, records,
    /// committed offsets and consumer groups. Killing a broker that is not running does
    /// nothing.
    ///
    /// Fails when this handle did not start the broker.
    pub fn kill(&mut self) -> Result<(), BrokerError> {
        self.own_launch()?;
        if let Some(mut child) = self.child.take() {
            child.kill().ok();
            child.wait()?;
        }
        Ok(())
    }

    /// Starts the broker again on the same port and the same storage directory, killing
    /// it first when it still runs; returns once it accepts connections. Clients keep
    /// their bootstrap address ([`brokers`](Self::brokers)) and reconnect by themselves.
    ///
    /// Fails when this handle did not start the broker, or when the broker does not
    /// listen again within 30 seconds (the port may still be taken for a moment after
    /// the kill, so a start that exits at once is tried again until then).
    ///
    /// tansu 0.6 keeps its consumer groups in this storage, members and all. When the
    /// members' sessions ran out while the broker was down, its group coordinator can be
    /// left waiting for a group leader that is no longer a member, and the group never
    /// completes a rebalance; another restart clears that (the coordinator drops a leader
    /// that is not a member when it reads the group back from storage).
    pub fn restart(&mut self) -> Result<(), BrokerError> {
        self.kill()?;
        self.launch(Duration::from_secs(30))
    }

    /// Whether the broker started by this handle is running (false after
    /// [`kill`](Self::kill), or when it exited by itself); false for a broker this
    /// handle did not start.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    /// The storage directory of a broker this handle started: the working directory of
    /// `tansu`, with its sqlite database `tansu.db` and its log `tansu.log` (stdout, each
    /// start appended after a line that says so) and `tansu.err` (stderr).
    pub fn storage_dir(&self) -> Option<&Path> {
        self.launch.as_ref().map(|launch| launch.dir.as_path())
    }

    /// The launch details, or why there are none.
    fn own_launch(&self) -> Result<&Launch, BrokerError> {
        self.launch
            .as_ref()
            .ok_or_else(|| BrokerError::NotStartedHere {
                brokers: self.brokers.clone(),
            })
    }

    /// Starts `tansu` on the handle's port and storage directory and waits until it
    /// listens; a start that exits before listening is retried until `within` ends.
    fn launch(&mut self, within: Duration) -> Result<(), BrokerError> {
        let deadline = Instant::now() + within;
        let address: SocketAddr = self.brokers.parse().expect("a socket address");
        loop {
            let launch = self
                .launch
                .as_mut()
                .ok_or_else(|| BrokerError::NotStartedHere {
                    brokers: self.brokers.clone(),
                })?;
            launch.starts += 1;
            let log_path = launch.dir.join("tansu.log");
            let mut log = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log_path)?;
            let mut err = OpenOptions::new()
                .create(true)
                .append(true)
                .open(launch.dir.join("tansu.err"))?;
            let banner = format!("--- idem: tansu start {} ---", launch.starts);
            writeln!(log, "{banner}")?;
            writeln!(err, "{banner}")?;
            let url = format!("tcp://127.0.0.1:{}", launch.port);
            // The sqlite path is relative to the working directory.
            let mut child = Command::new(&launch.binary)
                .args([
                    "broker",
                    "--listener-url",
                    &url,
                    "--advertised-listener-url",
                    &url,
                ])
                .args(["--storage-engine", "sqlite://tansu.db"])
                .current_dir(&launch.dir)
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(err)
                .spawn()?;
            let exited = loop {
                if TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_ok() {
                    self.child = Some(child);
                    return Ok(());
                }
                if let Some(status) = child.try_wait()? {
                    break Some(status);
                }
                if Instant::now() >= deadline {
                    break None;
                }
                std::thread::sleep(Duration::from_millis(100));
            };
            let binary = launch.binary.clone();
            match exited {
                Some(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(250));
                }
                _ => {
                    let reason = match exited {
                        Some(status) => format!("it exited with {status}"),
                        None => {
                            child.kill().ok();
                            child.wait().ok();
                            format!("it did not listen within {} s", within.as_secs())
                        }
                    };
                    return Err(BrokerError::DidNotStart {
                        binary,
                        reason,
                        log: log_path,
                    });
                }
            }
        }
    }

    /// The bootstrap servers to give clients.
    pub fn brokers(&self) -> &str {
        &self.brokers
    }

    /// Whether this handle started the broker (and stops it when dropped); such a broker
    /// can be killed and restarted.
    pub fn started_here(&self) -> bool {
        self.launch.is_some()
    }
}

impl Drop for LocalBroker {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().ok();
            child.wait().ok();
        }
        if let Some(launch) = self.launch.take() {
            std::fs::remove_dir_all(launch.dir).ok();
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

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

    /// Kill and restart keep the address and the storage: a record written before the
    /// kill is still there after the restart, and dropping the handle removes the storage.
    /// Skipped (with a note) when `tansu` is not installed.
    #[test]
    fn a_restarted_broker_keeps_its_port_and_its_records() {
        if find_tansu().is_none() {
            eprintln!("skipped: {}", BrokerError::NotInstalled);
            return;
        }
        let mut broker = LocalBroker::private().unwrap_or_else(|error| panic!("{error}"));
        let brokers = broker.brokers().to_owned();
        let dir = broker
            .storage_dir()
            .expect("a private broker has storage")
            .to_owned();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime
            .block_on(crate::kafka::admin::create_topic(
                &brokers,
                "restart-check",
                1,
            ))
            .expect("the topic is created");
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .create()
            .expect("a producer");
        producer
            .send(
                BaseRecord::<str, str>::to("restart-check")
                    .partition(0)
                    .payload("kept"),
            )
            .map_err(|(error, _)| error)
            .expect("the record is queued");
        producer
            .flush(Duration::from_secs(10))
            .expect("the record is written");
        drop(producer);

        broker.kill().expect("the broker is ours");
        assert!(!broker.is_running());
        let address: SocketAddr = brokers.parse().expect("a socket address");
        assert!(TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_err());
        assert!(
            dir.join("tansu.db").is_file(),
            "the storage outlives the kill"
        );

        broker.restart().expect("the broker starts again");
        assert!(broker.is_running());
        assert_eq!(broker.brokers(), brokers);
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .create()
            .expect("a client");
        let (_, high) = consumer
            .fetch_watermarks("restart-check", 0, Duration::from_secs(10))
            .expect("the watermarks");
        assert_eq!(high, 1, "the record written before the kill is still there");
        // Restarting a running broker kills it first.
        broker.restart().expect("the broker starts again");
        assert!(broker.is_running());

        drop(broker);
        assert!(!dir.exists(), "dropping the handle removes the storage");
    }

    #[test]
    fn a_broker_started_elsewhere_is_not_killed() {
        let mut broker = LocalBroker {
            brokers: "127.0.0.1:1".to_owned(),
            child: None,
            launch: None,
        };
        assert!(!broker.started_here());
        assert!(!broker.is_running());
        assert!(matches!(
            broker.kill(),
            Err(BrokerError::NotStartedHere { .. })
        ));
        assert!(matches!(
            broker.restart(),
            Err(BrokerError::NotStartedHere { .. })
        ));
        assert!(broker.storage_dir().is_none());
    }
}
