//! The transport trait and the in-memory transport.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::sync::mpsc;

use super::TransportStats;
use crate::proto::PeerAddr;

/// Moves whole MADs (256 bytes) between this CM and its peers' CMs. The transport does the
/// framing (BTH/DETH/ICRC for RoCEv2, the umad header, …); the driver sees MADs only.
///
/// `recv` must be cancel-safe: the driver polls it in a `select!` and drops it when another
/// branch wins.
pub trait DatagramTransport: Send + 'static {
    /// Sends one MAD.
    fn send(&mut self, to: PeerAddr, mad: &[u8]) -> impl Future<Output = io::Result<()>> + Send;

    /// Receives the next MAD and its source.
    fn recv(&mut self) -> impl Future<Output = io::Result<(PeerAddr, Bytes)>> + Send;

    /// This transport's own address (what peers use to reach it).
    fn local_addr(&self) -> PeerAddr;

    /// The transport's counters, above all the datagrams it dropped before the endpoint saw
    /// them, by reason ([`Cm::stats`](super::Cm::stats) reports them). The default: none.
    fn stats(&self) -> TransportStats {
        TransportStats::default()
    }
}

type Registry = Arc<Mutex<HashMap<PeerAddr, mpsc::UnboundedSender<(PeerAddr, Bytes)>>>>;

/// An in-memory network: transports created from it reach each other by address.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use ibcm::rt::{DatagramTransport, MemNetwork};
/// let net = MemNetwork::new();
/// let mut a = net.transport("127.0.0.1:4791".parse::<std::net::SocketAddr>().unwrap().into());
/// let mut b = net.transport("127.0.0.2:4791".parse::<std::net::SocketAddr>().unwrap().into());
/// a.send(b.local_addr(), &[7u8; 256]).await.unwrap();
/// let (from, mad) = b.recv().await.unwrap();
/// assert_eq!(from, a.local_addr());
/// assert_eq!(mad[0], 7);
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemNetwork {
    nodes: Registry,
}

impl MemNetwork {
    /// An empty network.
    pub fn new() -> Self {
        Self::default()
    }

    /// A transport with address `addr` (replacing any earlier one with that address).
    pub fn transport(&self, addr: PeerAddr) -> MemTransport {
        let (tx, rx) = mpsc::unbounded_channel();
        if let Ok(mut n) = self.nodes.lock() {
            n.insert(addr, tx);
        }
        MemTransport {
            addr,
            nodes: self.nodes.clone(),
            rx,
            loss: 0.0,
            rng: ChaCha8Rng::seed_from_u64(0),
        }
    }
}

/// One node of a [`MemNetwork`].
#[derive(Debug)]
pub struct MemTransport {
    addr: PeerAddr,
    nodes: Registry,
    rx: mpsc::UnboundedReceiver<(PeerAddr, Bytes)>,
    loss: f64,
    rng: ChaCha8Rng,
}

impl MemTransport {
    /// Drops each sent MAD with probability `loss`, drawn from an RNG seeded with `seed`.
    pub fn with_loss(mut self, loss: f64, seed: u64) -> Self {
        self.loss = loss;
        self.rng = ChaCha8Rng::seed_from_u64(seed);
        self
    }
}

impl DatagramTransport for MemTransport {
    async fn send(&mut self, to: PeerAddr, mad: &[u8]) -> io::Result<()> {
        if self.loss > 0.0 && self.rng.random_bool(self.loss.min(1.0)) {
            return Ok(());
        }
        let tx = self
            .nodes
            .lock()
            .map_err(|_| io::Error::other("memory network poisoned"))?
            .get(&to)
            .cloned();
        match tx {
            // Like UDP: a datagram to nobody, or to a node that went away, is lost.
            Some(tx) => {
                let _ = tx.send((self.addr, Bytes::copy_from_slice(mad)));
                Ok(())
            }
            None => Ok(()),
        }
    }

    async fn recv(&mut self) -> io::Result<(PeerAddr, Bytes)> {
        self.rx
            .recv()
            .await
            .ok_or_else(|| io::Error::new(io::ErrorKind::BrokenPipe, "memory network closed"))
    }

    fn local_addr(&self) -> PeerAddr {
        self.addr
    }
}
