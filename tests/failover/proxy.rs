//! A TCP forwarding proxy on a loopback port of its own, in the test process: what stands
//! between the clients and PostgreSQL (a cloud database's endpoint) and between the
//! standby and the primary (the network that replication crosses).
//!
//! It can be **paused**: no byte moves either way, connections are left open and hanging,
//! as a silent network does. And it can be **moved**: every open connection is closed and
//! new ones go to another server; while it has nowhere to go (between a primary's death
//! and a standby's promotion), new connections wait for the move, at most
//! [`WAIT_FOR_TARGET`], then are closed.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{AbortHandle, JoinHandle};

/// How long a connection accepted while the proxy has no target waits for one.
pub const WAIT_FOR_TARGET: Duration = Duration::from_secs(10);

/// A forwarding proxy; dropping it stops it and closes its connections.
pub struct Proxy {
    address: SocketAddr,
    shared: Arc<Shared>,
    accepting: JoinHandle<()>,
}

struct Shared {
    /// Where new connections go; `None` while moving.
    target: watch::Sender<Option<SocketAddr>>,
    /// Whether bytes stop.
    paused: watch::Sender<bool>,
    /// Counts the moves: a connection forwarded before the latest one is closed.
    generation: watch::Sender<u64>,
    /// The tasks of the connections, to end them with the proxy.
    connections: Mutex<Vec<AbortHandle>>,
}

impl Proxy {
    /// Listens on a free port of 127.0.0.1 and forwards every connection to `target`.
    pub async fn start(target: SocketAddr) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let shared = Arc::new(Shared {
            target: watch::channel(Some(target)).0,
            paused: watch::channel(false).0,
            generation: watch::channel(0).0,
            connections: Mutex::new(Vec::new()),
        });
        let accepting = tokio::spawn(accept(listener, shared.clone()));
        Ok(Proxy {
            address,
            shared,
            accepting,
        })
    }

    /// The address the clients connect to; it never changes.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Stops forwarding bytes, both ways, on every connection, open or new.
    pub fn pause(&self) {
        self.shared.paused.send_replace(true);
    }

    /// Forwards bytes again.
    pub fn resume(&self) {
        self.shared.paused.send_replace(false);
    }

    /// Closes every forwarded connection and holds new ones until
    /// [`move_to`](Self::move_to).
    pub fn detach(&self) {
        self.shared.target.send_replace(None);
        self.shared
            .generation
            .send_modify(|generation| *generation += 1);
    }

    /// Closes every forwarded connection and forwards new ones (and those held) to
    /// `target`.
    pub fn move_to(&self, target: SocketAddr) {
        self.shared.target.send_replace(Some(target));
        self.shared
            .generation
            .send_modify(|generation| *generation += 1);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accepting.abort();
        for task in lock(&self.shared.connections).drain(..) {
            task.abort();
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

async fn accept(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        client.set_nodelay(true).ok();
        let task = tokio::spawn(forward(client, shared.clone()));
        let mut connections = lock(&shared.connections);
        connections.retain(|task| !task.is_finished());
        connections.push(task.abort_handle());
    }
}

/// One connection: waits for a target, connects, then pumps both ways until either side
/// closes or the proxy moves.
async fn forward(client: TcpStream, shared: Arc<Shared>) {
    let mut targets = shared.target.subscribe();
    let mut generations = shared.generation.subscribe();
    let (server, generation) = loop {
        let generation = *generations.borrow_and_update();
        let target = match tokio::time::timeout(
            WAIT_FOR_TARGET,
            targets.wait_for(|target| target.is_some()),
        )
        .await
        {
            Ok(Ok(target)) => target.expect("waited for a target"),
            _ => return,
        };
        let Ok(server) = TcpStream::connect(target).await else {
            return;
        };
        // Moved while connecting: the connection went to the old target; try again.
        if *generations.borrow_and_update() == generation {
            break (server, generation);
        }
    };
    server.set_nodelay(true).ok();
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let upstream = pump(client_read, server_write, shared.paused.subscribe());
    let downstream = pump(server_read, client_write, shared.paused.subscribe());
    // Either direction ending ends the connection: the other half is dropped with it.
    tokio::select! {
        _ = upstream => {}
        _ = downstream => {}
        _ = generations.wait_for(|now| *now != generation) => {}
    }
}

/// Copies bytes from `from` to `to`, holding them while the proxy is paused.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut paused: watch::Receiver<bool>,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        // Not even read while paused: the sender's buffers fill up, as on a dead link.
        if paused.wait_for(|paused| !*paused).await.is_err() {
            return;
        }
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        if paused.wait_for(|paused| !*paused).await.is_err() {
            return;
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on a free port: returns its address.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut socket, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let (mut read, mut write) = socket.split();
                    tokio::io::copy(&mut read, &mut write).await.ok();
                });
            }
        });
        address
    }

    async fn round_trip(stream: &mut TcpStream, bytes: &[u8]) -> std::io::Result<Vec<u8>> {
        stream.write_all(bytes).await?;
        let mut back = vec![0u8; bytes.len()];
        stream.read_exact(&mut back).await?;
        Ok(back)
    }

    #[tokio::test]
    async fn forwards_pauses_and_moves() {
        let (first, second) = (echo().await, echo().await);
        let proxy = Proxy::start(first).await.unwrap();
        let mut client = TcpStream::connect(proxy.address()).await.unwrap();
        assert_eq!(round_trip(&mut client, b"hello").await.unwrap(), b"hello");

        // Paused: the bytes hang; resumed: they arrive.
        proxy.pause();
        client.write_all(b"held").await.unwrap();
        let mut back = [0u8; 4];
        let waited =
            tokio::time::timeout(Duration::from_millis(300), client.read_exact(&mut back)).await;
        assert!(waited.is_err(), "nothing moves while paused");
        proxy.resume();
        client.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"held");

        // Detached: the open connection is closed, a new one waits for the move.
        proxy.detach();
        let mut end = [0u8; 1];
        assert!(matches!(client.read(&mut end).await, Ok(0) | Err(_)));
        let mut waiting = TcpStream::connect(proxy.address()).await.unwrap();
        let early =
            tokio::time::timeout(Duration::from_millis(300), round_trip(&mut waiting, b"x")).await;
        assert!(early.is_err(), "no answer before the move");
        proxy.move_to(second);
        let mut back = [0u8; 1];
        waiting.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"x");
        let mut moved = TcpStream::connect(proxy.address()).await.unwrap();
        assert_eq!(round_trip(&mut moved, b"again").await.unwrap(), b"again");
    }
}
