//! A counting TCP proxy between a bench's client and PostgreSQL, shared by the benches
//! (`#[path]`): the suite's round-trip probe, and the Kafka bench's consumers, which it
//! can also hold back by a round trip of network latency.
//!
//! Bytes are forwarded unchanged; the proxy only frames the wire protocol (a type byte and
//! a length per message) to count, per direction, the messages that matter:
//!
//! - client: `Q` (simple query), `P` (parse), `B` (bind), `E` (execute), `S` (sync);
//! - server: `Z` (ReadyForQuery), one per `Q` or `S`.
//!
//! A *round trip* is counted when the client sends a sync point (`Q`, `S`, or the startup
//! message) while it waits for no earlier one: the client then has to wait for the server.
//! Sync points pipelined behind an unanswered one (sqlx queues the `ROLLBACK` of a dropped
//! transaction and flushes it with the pool's release ping) share that round trip.

// Each bench uses a part of it (the suite no delay).
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Counters over all connections through the proxy.
#[derive(Debug, Default)]
pub struct Counters {
    pub round_trips: AtomicU64,
    pub ready: AtomicU64,
    pub simple_queries: AtomicU64,
    pub parses: AtomicU64,
    pub binds: AtomicU64,
    pub executes: AtomicU64,
    pub syncs: AtomicU64,
}

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub struct Snapshot {
    pub round_trips: u64,
    pub ready: u64,
    pub simple_queries: u64,
    pub parses: u64,
    pub binds: u64,
    pub executes: u64,
    pub syncs: u64,
}

impl Snapshot {
    pub fn since(self, earlier: Snapshot) -> Snapshot {
        Snapshot {
            round_trips: self.round_trips - earlier.round_trips,
            ready: self.ready - earlier.ready,
            simple_queries: self.simple_queries - earlier.simple_queries,
            parses: self.parses - earlier.parses,
            binds: self.binds - earlier.binds,
            executes: self.executes - earlier.executes,
            syncs: self.syncs - earlier.syncs,
        }
    }
}

impl Counters {
    pub fn snapshot(&self) -> Snapshot {
        let get = |counter: &AtomicU64| counter.load(Ordering::SeqCst);
        Snapshot {
            round_trips: get(&self.round_trips),
            ready: get(&self.ready),
            simple_queries: get(&self.simple_queries),
            parses: get(&self.parses),
            binds: get(&self.binds),
            executes: get(&self.executes),
            syncs: get(&self.syncs),
        }
    }
}

/// A running proxy; it stops with the runtime ([`Proxy::start`]) or with the process
/// ([`Proxy::start_delayed`]).
pub struct Proxy {
    pub port: u16,
    pub counters: Arc<Counters>,
    /// Half the round trip added, in nanoseconds: how long each chunk is held in each
    /// direction (threaded proxy only).
    one_way_nanos: Arc<AtomicU64>,
}

impl Proxy {
    /// Listens on an ephemeral loopback port and forwards to `upstream` (`host:port`).
    pub async fn start(upstream: String) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let counters = Arc::new(Counters::default());
        let shared = counters.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let counters = shared.clone();
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&upstream).await {
                        relay(client, server, counters).await;
                    }
                });
            }
        });
        Ok(Proxy {
            port,
            counters,
            one_way_nanos: Arc::default(),
        })
    }

    /// Like [`start`](Self::start), on threads of its own (blocking sockets, no async
    /// runtime), and holding every chunk it forwards for half of a round trip set with
    /// [`set_round_trip`](Self::set_round_trip) in each direction: a network between the
    /// client and PostgreSQL where the machine has none (loopback only). Chunks keep
    /// their order and a connection's chunks in flight overlap, as on a wire. The hold is
    /// a `std::thread::sleep` (tokio's timer counts milliseconds), which overshoots by some
    /// tens of microseconds a hop: measure the round trip the client sees.
    pub fn start_delayed(upstream: String) -> std::io::Result<Proxy> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let counters = Arc::new(Counters::default());
        let one_way_nanos = Arc::new(AtomicU64::new(0));
        let (shared, delay) = (counters.clone(), one_way_nanos.clone());
        std::thread::Builder::new()
            .name("proxy-accept".into())
            .spawn(move || {
                for client in listener.incoming() {
                    let Ok(client) = client else { continue };
                    let Ok(server) = std::net::TcpStream::connect(&upstream) else {
                        continue;
                    };
                    threaded::relay(client, server, shared.clone(), delay.clone()).ok();
                }
            })?;
        Ok(Proxy {
            port,
            counters,
            one_way_nanos,
        })
    }

    /// The round trip that [`start_delayed`](Self::start_delayed)'s proxy adds from now
    /// on: each chunk is held for half of it in each direction.
    pub fn set_round_trip(&self, round_trip: std::time::Duration) {
        let half = u64::try_from(round_trip.as_nanos() / 2).unwrap_or(u64::MAX);
        self.one_way_nanos.store(half, Ordering::SeqCst);
    }
}

/// Counts a client's message of type `kind` (`None`: the startup message); `pending` is
/// the connection's sync points not answered yet.
fn count_client(counters: &Counters, pending: &AtomicI64, kind: Option<u8>) {
    let sync_point = match kind {
        Some(b'Q') => {
            counters.simple_queries.fetch_add(1, Ordering::SeqCst);
            true
        }
        Some(b'S') => {
            counters.syncs.fetch_add(1, Ordering::SeqCst);
            true
        }
        Some(b'P') => {
            counters.parses.fetch_add(1, Ordering::SeqCst);
            false
        }
        Some(b'B') => {
            counters.binds.fetch_add(1, Ordering::SeqCst);
            false
        }
        Some(b'E') => {
            counters.executes.fetch_add(1, Ordering::SeqCst);
            false
        }
        // The startup message is answered by a ReadyForQuery too.
        None => true,
        Some(_) => false,
    };
    if sync_point && pending.fetch_add(1, Ordering::SeqCst) == 0 {
        counters.round_trips.fetch_add(1, Ordering::SeqCst);
    }
}

/// Counts a server's message of type `kind`.
fn count_server(counters: &Counters, pending: &AtomicI64, kind: Option<u8>) {
    if kind == Some(b'Z') {
        counters.ready.fetch_add(1, Ordering::SeqCst);
        pending.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The proxy of [`Proxy::start_delayed`]: per connection and direction, a thread that
/// reads and counts, and a thread that writes each chunk once it is due.
mod threaded {
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpStream};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    use super::{Counters, Framer, count_client, count_server};

    pub(super) fn relay(
        client: TcpStream,
        server: TcpStream,
        counters: Arc<Counters>,
        one_way_nanos: Arc<AtomicU64>,
    ) -> std::io::Result<()> {
        client.set_nodelay(true)?;
        server.set_nodelay(true)?;
        let pending = Arc::new(AtomicI64::new(0));
        let upstream = Direction {
            from: client.try_clone()?,
            to: server.try_clone()?,
            framer: Framer::new(true),
            count: count_client,
        };
        let downstream = Direction {
            from: server,
            to: client,
            framer: Framer::new(false),
            count: count_server,
        };
        for direction in [upstream, downstream] {
            direction.start(counters.clone(), pending.clone(), one_way_nanos.clone())?;
        }
        Ok(())
    }

    struct Direction {
        from: TcpStream,
        to: TcpStream,
        framer: Framer,
        count: fn(&Counters, &AtomicI64, Option<u8>),
    }

    impl Direction {
        fn start(
            self,
            counters: Arc<Counters>,
            pending: Arc<AtomicI64>,
            one_way_nanos: Arc<AtomicU64>,
        ) -> std::io::Result<()> {
            let Direction {
                mut from,
                mut to,
                mut framer,
                count,
            } = self;
            let (chunks, due) = mpsc::channel::<(Instant, Vec<u8>)>();
            std::thread::Builder::new()
                .name("proxy-write".into())
                .spawn(move || {
                    for (at, chunk) in due {
                        let wait = at.saturating_duration_since(Instant::now());
                        if !wait.is_zero() {
                            std::thread::sleep(wait);
                        }
                        if to.write_all(&chunk).is_err() {
                            break;
                        }
                    }
                    to.shutdown(Shutdown::Write).ok();
                })?;
            std::thread::Builder::new()
                .name("proxy-read".into())
                .spawn(move || {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match from.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        let arrived = Instant::now();
                        // Count before forwarding, so that the answer cannot overtake the count.
                        framer.feed(&buf[..n], |kind| count(&counters, &pending, kind));
                        let hold = Duration::from_nanos(one_way_nanos.load(Ordering::Relaxed));
                        if chunks.send((arrived + hold, buf[..n].to_vec())).is_err() {
                            break;
                        }
                    }
                })?;
            Ok(())
        }
    }
}

async fn relay(client: TcpStream, server: TcpStream, counters: Arc<Counters>) {
    client.set_nodelay(true).ok();
    server.set_nodelay(true).ok();
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    // Sync points sent and not yet answered by a ReadyForQuery, on this connection.
    let pending = Arc::new(AtomicI64::new(0));

    let upstream = {
        let counters = counters.clone();
        let pending = pending.clone();
        async move {
            let mut framer = Framer::new(true);
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match client_read.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                // Count before forwarding, so that the answer cannot overtake the count.
                framer.feed(&buf[..n], |kind| count_client(&counters, &pending, kind));
                if server_write.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
            server_write.shutdown().await.ok();
        }
    };
    let downstream = async move {
        let mut framer = Framer::new(false);
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match server_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            framer.feed(&buf[..n], |kind| count_server(&counters, &pending, kind));
            if client_write.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        client_write.shutdown().await.ok();
    };
    tokio::join!(upstream, downstream);
}

/// Splits a byte stream into protocol messages, reporting each one's type byte (`None`
/// for the untyped startup message).
struct Framer {
    /// The next message is the untyped startup message.
    startup: bool,
    header: Vec<u8>,
    /// Body bytes of the current message still to skip.
    remaining: usize,
}

impl Framer {
    fn new(startup: bool) -> Self {
        Framer {
            startup,
            header: Vec::with_capacity(5),
            remaining: 0,
        }
    }

    fn feed(&mut self, mut bytes: &[u8], mut on_message: impl FnMut(Option<u8>)) {
        while !bytes.is_empty() {
            if self.remaining > 0 {
                let skip = self.remaining.min(bytes.len());
                self.remaining -= skip;
                bytes = &bytes[skip..];
                continue;
            }
            let header_len = if self.startup { 4 } else { 5 };
            let take = (header_len - self.header.len()).min(bytes.len());
            self.header.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.header.len() < header_len {
                return;
            }
            let (kind, length) = if self.startup {
                (None, &self.header[..4])
            } else {
                (Some(self.header[0]), &self.header[1..5])
            };
            let length = u32::from_be_bytes([length[0], length[1], length[2], length[3]]);
            // The length counts itself (4 bytes) but not the type byte.
            self.remaining = (length as usize).saturating_sub(4);
            on_message(kind);
            self.startup = false;
            self.header.clear();
        }
    }
}
