//! A network between the consumers and PostgreSQL: a TCP proxy on a loopback port of its
//! own that forwards bytes both ways, holding each chunk for half the round trip.
//!
//! On threads of its own, not on the test's runtime: a chunk is held with
//! `std::thread::sleep` (tokio's timer counts whole milliseconds), and a busy test thread
//! adds nothing to the link. Chunks are held side by side: a chunk read while an earlier
//! one waits is due half a round trip after it was read, as on a wire.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A delaying proxy; dropping it stops accepting (open connections end with their
/// clients).
pub struct SlowLink {
    address: SocketAddr,
    stopped: Arc<AtomicBool>,
}

impl SlowLink {
    /// Listens on a free port of 127.0.0.1 and forwards every connection to `target`
    /// (`host:port`), `round_trip` added to each round trip.
    pub fn start(target: &str, round_trip: Duration) -> std::io::Result<SlowLink> {
        let addresses: Vec<SocketAddr> = target.to_socket_addrs()?.collect();
        let target = addresses
            .iter()
            .find(|address| address.is_ipv4())
            .or(addresses.first())
            .copied()
            .ok_or_else(|| std::io::Error::other("the target has no address"))?;
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let address = listener.local_addr()?;
        let stopped = Arc::new(AtomicBool::new(false));
        let stop = stopped.clone();
        let hold = round_trip / 2;
        std::thread::Builder::new()
            .name("slow-link".into())
            .spawn(move || {
                for client in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(client) = client else { continue };
                    let Ok(server) = TcpStream::connect(target) else {
                        continue;
                    };
                    forward(client, server, hold);
                }
            })?;
        Ok(SlowLink { address, stopped })
    }

    /// The address the clients connect to.
    pub fn address(&self) -> SocketAddr {
        self.address
    }
}

impl Drop for SlowLink {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::SeqCst);
        // Wakes the accepting thread, which then sees the flag.
        TcpStream::connect(self.address).ok();
    }
}

/// Pumps both ways between `client` and `server`, each chunk held `hold`.
fn forward(client: TcpStream, server: TcpStream, hold: Duration) {
    client.set_nodelay(true).ok();
    server.set_nodelay(true).ok();
    let pairs = [
        (client.try_clone(), server.try_clone()),
        (server.try_clone(), client.try_clone()),
    ];
    for (from, to) in pairs {
        let (Ok(from), Ok(to)) = (from, to) else {
            return;
        };
        pump(from, to, hold);
    }
}

/// One direction: a thread reads chunks and stamps them, another writes each when due.
fn pump(mut from: TcpStream, mut to: TcpStream, hold: Duration) {
    let (chunks, due) = mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(read) => {
                    if chunks
                        .send((Instant::now() + hold, buffer[..read].to_vec()))
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
        // Dropping the sender ends the writer once it wrote what is held.
    });
    std::thread::spawn(move || {
        while let Ok((at, chunk)) = due.recv() {
            let now = Instant::now();
            if at > now {
                std::thread::sleep(at - now);
            }
            if to.write_all(&chunk).is_err() {
                break;
            }
        }
        to.shutdown(Shutdown::Both).ok();
    });
}
