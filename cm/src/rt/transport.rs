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
use crate::proto::{PeerAddr, Transmit};

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

    /// Waits for at least one MAD, then appends it to `out` together with the MADs that are
    /// ready at the same time (as many as one system call returns, for transports that can
    /// receive several at once). Cancel-safe like [`recv`](Self::recv): nothing is taken
    /// from the transport unless the future completes. The default: one [`recv`](Self::recv).
    fn recv_batch(
        &mut self,
        out: &mut Vec<(PeerAddr, Bytes)>,
    ) -> impl Future<Output = io::Result<()>> + Send {
        async move {
            let m = self.recv().await?;
            out.push(m);
            Ok(())
        }
    }

    /// Appends to `out` the MADs that are ready now, without waiting (a bounded number: one
    /// batch); none is an `Ok`. The default: none (the driver then waits in
    /// [`recv_batch`](Self::recv_batch)).
    ///
    /// # Errors
    /// What [`recv`](Self::recv) would fail with.
    fn try_recv_batch(&mut self, out: &mut Vec<(PeerAddr, Bytes)>) -> io::Result<()> {
        let _ = out;
        Ok(())
    }

    /// Sends `mads` in order, as many per system call as the transport can. A MAD that cannot
    /// be sent is skipped like a lost packet (the core retransmits requests); the returned
    /// list says which (index into `mads`) and why. The default: one [`send`](Self::send)
    /// per MAD.
    fn send_batch(
        &mut self,
        mads: &[Transmit],
    ) -> impl Future<Output = Vec<(usize, io::Error)>> + Send {
        async move {
            let mut failed = Vec::new();
            for (i, t) in mads.iter().enumerate() {
                if let Err(e) = self.send(t.to, &t.mad).await {
                    failed.push((i, e));
                }
            }
            failed
        }
    }

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

    async fn recv_batch(&mut self, out: &mut Vec<(PeerAddr, Bytes)>) -> io::Result<()> {
        let m = self.recv().await?;
        out.push(m);
        self.try_recv_batch(out)
    }

    fn try_recv_batch(&mut self, out: &mut Vec<(PeerAddr, Bytes)>) -> io::Result<()> {
        for _ in 0..MEM_BATCH {
            match self.rx.try_recv() {
                Ok(m) => out.push(m),
                // Closed with nothing left: the next `recv` reports it.
                Err(_) => break,
            }
        }
        Ok(())
    }

    fn local_addr(&self) -> PeerAddr {
        self.addr
    }
}

/// MADs a [`MemTransport`] hands over per batch (as many as the UDP transport per system
/// call).
const MEM_BATCH: usize = 64;
