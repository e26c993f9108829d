//! A `redis-server` of the suite's own, on a free port of 127.0.0.1, without persistence:
//! the chaos stops it (`SHUTDOWN NOSAVE`), kills it (SIGKILL), flushes it and starts it
//! again. Killed when dropped.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use idem_runtime::cache::redis;

/// A private Redis; `None` in `child` while it is down.
pub struct ThrowawayRedis {
    port: u16,
    child: Option<Child>,
}

impl ThrowawayRedis {
    /// Starts a server on a free port and waits until it answers.
    ///
    /// # Panics
    ///
    /// When `redis-server` is missing (saying what to install) or does not answer.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
        let port = listener.local_addr().expect("its address").port();
        drop(listener);
        let mut server = ThrowawayRedis { port, child: None };
        server.start_again().await;
        server
    }

    /// The server's URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts the server (again), empty, and waits until it answers `PING`.
    pub async fn start_again(&mut self) {
        if self.child.is_some() {
            return;
        }
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(std::env::temp_dir())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| {
                panic!(
                    "start redis-server: {error}; the fault suite needs it (Debian or Ubuntu: \
                     `sudo apt-get install -y redis-server`)"
                )
            });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.answers().await {
            assert!(
                Instant::now() < deadline,
                "the private redis-server does not answer"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn answers(&self) -> bool {
        self.command(&redis::cmd("PING")).await
    }

    /// Runs `command` on the server; whether it was answered.
    pub async fn command(&self, command: &redis::Cmd) -> bool {
        let Ok(client) = redis::Client::open(self.url().as_str()) else {
            return false;
        };
        let Ok(Ok(mut conn)) = tokio::time::timeout(
            Duration::from_secs(1),
            client.get_multiplexed_async_connection(),
        )
        .await
        else {
            return false;
        };
        matches!(
            tokio::time::timeout(
                Duration::from_secs(1),
                command.query_async::<redis::Value>(&mut conn)
            )
            .await,
            Ok(Ok(_))
        )
    }

    /// Empties the server (`FLUSHALL`): every cached success is forgotten.
    pub async fn flush(&self) -> bool {
        self.command(&redis::cmd("FLUSHALL")).await
    }

    /// Stops the server the polite way (`SHUTDOWN NOSAVE`) and reaps it.
    pub async fn shut_down(&mut self) {
        // The server closes the connection instead of answering.
        let _ = self.command(redis::cmd("SHUTDOWN").arg("NOSAVE")).await;
        if let Some(mut child) = self.child.take() {
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                match child.try_wait() {
                    Ok(Some(_)) => break,
                    _ if Instant::now() > deadline => {
                        child.kill().ok();
                        child.wait().ok();
                        break;
                    }
                    _ => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
        }
    }

    /// Kills the server (SIGKILL): its connections drop mid-command.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().ok();
            child.wait().ok();
        }
    }
}

impl Drop for ThrowawayRedis {
    fn drop(&mut self) {
        self.kill();
    }
}
