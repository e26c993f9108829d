//! A TCP forwarding proxy on a loopback port of its own, in the test process: what stands
//! between the clients and PostgreSQL (a cloud database's endpoint) and between the
//! standby and the primary (the network that replication crosses).
//!
//! It can be **paused**: no byte moves either way, connections are left open and hanging,
//! as a silent network does. And it can be **moved**: every open connection is closed and
//! new ones go to another server; while it has nowhere to go (between a primary's death
//! and a standby's promotion), new connections wait for the move, at most
//! [`WAIT_FOR_TARGET`], then are closed.
//!
//! It runs on a runtime of its own, on a thread of its own, as a network is apart from the
//! processes it links: the consumers under test block their runtime's workers at times
//! (an rdkafka rebalance callback is synchronous, and reads the stored offsets through
//! this proxy from a thread of its own); sharing those workers, the proxy would wait for
//! the very callbacks that wait for it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;
use tokio::sync::watch;

/// How long a connection accepted while the proxy has no target waits for one.
pub const WAIT_FOR_TARGET: Duration = Duration::from_secs(10);

/// A forwarding proxy; dropping it stops it and closes its connections.
pub struct Proxy {
    address: SocketAddr,
    shared: Arc<Shared>,
    /// The proxy's own runtime (one worker thread): the listener and every connection.
    runtime: Option<Runtime>,
}

struct Shared {
    /// Where new connections go, and how many moves there were: one value, so that a
    /// connection never pairs a target with another move's count.
    route: watch::Sender<Route>,
    /// Whether bytes stop.
    paused: watch::Sender<bool>,
}

/// Where the proxy forwards.
#[derive(Clone, Copy)]
struct Route {
    /// Counts the moves: a connection forwarded before the latest one is closed.
    generation: u64,
    /// Where new connections go; `None` while moving.
    target: Option<SocketAddr>,
}

impl Proxy {
    /// Listens on a free port of 127.0.0.1 and forwards every connection to `target`.
    pub fn start(target: SocketAddr) -> std::io::Result<Proxy> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("failover-proxy")
            .enable_all()
            .build()?;
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let address = listener.local_addr()?;
        let listener = {
            let _inside = runtime.enter();
            TcpListener::from_std(listener)?
        };
        let shared = Arc::new(Shared {
            route: watch::channel(Route {
                generation: 0,
                target: Some(target),
            })
            .0,
            paused: watch::channel(false).0,
        });
        runtime.spawn(accept(listener, shared.clone()));
        Ok(Proxy {
            address,
            shared,
            runtime: Some(runtime),
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
        self.shared.route.send_modify(|route| {
            route.generation += 1;
            route.target = None;
        });
    }

    /// Closes every forwarded connection and forwards new ones (and those held) to
    /// `target`.
    pub fn move_to(&self, target: SocketAddr) {
        self.shared.route.send_modify(|route| {
            route.generation += 1;
            route.target = Some(target);
        });
    }
}

impl Drop for Proxy {
    /// Ends the listener and every connection's task with the runtime (without waiting
    /// for them: the test's own runtime may be the caller).
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

async fn accept(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        client.set_nodelay(true).ok();
        tokio::spawn(forward(client, shared.clone()));
    }
}

/// One connection: waits for a target, connects, then pumps both ways until either side
/// closes or the proxy moves.
async fn forward(client: TcpStream, shared: Arc<Shared>) {
    let mut routes = shared.route.subscribe();
    let (server, generation) = loop {
        let route = match tokio::time::timeout(
            WAIT_FOR_TARGET,
            routes.wait_for(|route| route.target.is_some()),
        )
        .await
        {
            Ok(Ok(route)) => *route,
            _ => return,
        };
        let target = route.target.expect("waited for a target");
        let Ok(server) = TcpStream::connect(target).await else {
            return;
        };
        // A dead server's port is in the ephemeral range: a connection to it may get that
        // very port as its own and connect to itself (TCP's simultaneous open), and its
        // client would read its own bytes back. That is a refused connection.
        if server.local_addr().ok() == server.peer_addr().ok() {
            return;
        }
        // Moved while connecting: the connection went to the old target; try again.
        if routes.borrow_and_update().generation == route.generation {
            break (server, route.generation);
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
        _ = routes.wait_for(|route| route.generation != generation) => {}
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

    /// An echo server on a free port, on a thread of its own, off every runtime.
    fn echo_on_a_thread() -> SocketAddr {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for socket in listener.incoming() {
                let Ok(mut socket) = socket else { return };
                std::thread::spawn(move || {
                    let mut read = socket.try_clone().unwrap();
                    std::io::copy(&mut read, &mut socket).ok();
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

    /// The proxy forwards while every worker of the runtime that started it is blocked,
    /// as the consumers' rebalance callbacks block theirs while they read through it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn forwards_while_the_workers_of_its_caller_are_blocked() {
        use std::io::{Read, Write};
        use std::sync::Barrier;

        let proxy = Proxy::start(echo_on_a_thread()).unwrap();
        let address = proxy.address();
        let blocked = Arc::new(Barrier::new(3));
        let released = Arc::new(Barrier::new(3));
        let blockers: Vec<_> = (0..2)
            .map(|_| {
                let (blocked, released) = (blocked.clone(), released.clone());
                tokio::spawn(async move {
                    blocked.wait();
                    released.wait();
                })
            })
            .collect();
        // Both workers are in a blocking wait from here on.
        let answered = std::thread::spawn({
            let blocked = blocked.clone();
            move || {
                blocked.wait();
                let mut stream = std::net::TcpStream::connect(address)?;
                stream.set_read_timeout(Some(Duration::from_secs(5)))?;
                stream.write_all(b"ping")?;
                let mut back = [0u8; 4];
                stream.read_exact(&mut back)?;
                Ok::<_, std::io::Error>(back)
            }
        })
        .join()
        .unwrap();
        released.wait();
        for blocker in blockers {
            blocker.await.unwrap();
        }
        assert_eq!(
            &answered.expect("an answer through the proxy within 5 s"),
            b"ping"
        );
    }

    #[tokio::test]
    async fn forwards_pauses_and_moves() {
        let (first, second) = (echo().await, echo().await);
        let proxy = Proxy::start(first).unwrap();
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
