//! `cm-async-listen` and `cm-async-connect`: ibcm's tokio driver and async API ([`Cm`],
//! [`Connection`](ibcm::rt::Connection)) LID-routed on the simulated port, through [`SimPort`], a
//! [`DatagramTransport`] over the same device the sans-IO cells use (module `cm`).
//!
//! umad2sim serves `poll` but not epoll, so tokio cannot wait on the device: a thread of the
//! transport does all of its I/O — it writes the MADs the driver sends (a channel), reads
//! with a 1 ms `poll` (answering OpenSM's SMPs as `cm` does) and hands the CM MADs to the
//! driver through another channel. One thread only: umad2sim's `write` and `read` on one
//! device from two threads at once hung a write now and then (about 1 run in 3 of the lab).
//!
//! ```text
//! ib-fabric-probe cm-async-listen [--service S] [--count N]
//! ib-fabric-probe cm-async-connect --dlid N [--service S] [--count N] [--qpn Q]
//! ```
//! They do what `cm-listen` and `cm-connect` do, through `Cm::listen` / `Incoming::accept`
//! and `Cm::connect` / `Connection::disconnect`, and print `async listen established E closed
//! C` and `async connect established E of N closed C … in T ms`.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ibcm::proto::{AcceptParams, IbAddr, ListenOptions, PeerAddr};
use ibcm::rt::{Cm, DatagramTransport};
use ibcm_mad::{Lid, Qpn};
use tokio::sync::mpsc;

use super::cm::{config, qp1, service_and_count, CmDev, Target};
use super::{Args, Dev, Port};

/// The simulated port as a transport: its thread writes what `send` queues and reads.
struct SimPort {
    out: std::sync::mpsc::Sender<(IbAddr, Vec<u8>)>,
    rx: mpsc::Receiver<(PeerAddr, Bytes)>,
    local: PeerAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for SimPort {
    /// Stops the thread once it has written what was queued (the last DREP of a process
    /// that exits next must still reach its peer).
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl SimPort {
    fn start(dev: CmDev, port: &Port) -> Self {
        let (tx, rx) = mpsc::channel(1024);
        let (out, out_rx) = std::sync::mpsc::channel::<(IbAddr, Vec<u8>)>();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let d = dev;
            loop {
                let stopping = s.load(Ordering::Relaxed);
                while let Ok((to, mad)) = out_rx.try_recv() {
                    if let Err(e) = d.send_cm(&to, &mad) {
                        eprintln!("writer: {e}");
                        return;
                    }
                }
                if stopping {
                    return;
                }
                match d.recv_cm(Duration::from_millis(1)) {
                    // a full queue drops the MAD, as a full socket buffer would (the CM
                    // resends); never a blocking send, which could hold up the drop's join
                    Ok(Some((from, mad))) => {
                        if let Err(mpsc::error::TrySendError::Closed(_)) =
                            tx.try_send((PeerAddr::Ib(from), Bytes::from(mad)))
                        {
                            return;
                        }
                    }
                    Ok(None) => {}
                    Err(e) => {
                        eprintln!("reader: {e}");
                        return;
                    }
                }
            }
        });
        SimPort {
            out,
            rx,
            local: PeerAddr::Ib(qp1(Lid(port.lid), 0)),
            stop,
            thread: Some(thread),
        }
    }
}

impl DatagramTransport for SimPort {
    async fn send(&mut self, to: PeerAddr, mad: &[u8]) -> io::Result<()> {
        let PeerAddr::Ib(to) = to else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an IB port sends to IB addresses",
            ));
        };
        self.out
            .send((to, mad.to_vec()))
            .map_err(|_| io::Error::other("the port's thread stopped"))
    }

    async fn recv(&mut self) -> io::Result<(PeerAddr, Bytes)> {
        self.rx
            .recv()
            .await
            .ok_or_else(|| io::Error::other("the reader thread stopped"))
    }

    fn local_addr(&self) -> PeerAddr {
        self.local
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio: {e}"))
}

/// `cm-async-listen`.
pub(crate) fn listen(args: &Args, port: &Port, sa: Dev) -> Result<bool, String> {
    let (service, count) = service_and_count(args)?;
    let dev = CmDev::open(sa.umad, port)?;
    runtime()?.block_on(async {
        let (cm, _driver) = Cm::bind(SimPort::start(dev, port), config(port));
        let mut l = cm
            .listen(service, ListenOptions::default())
            .await
            .map_err(|e| format!("listen: {e}"))?;
        println!("listening on {service} lid {}", port.lid);
        let (mut established, mut closed) = (0u64, 0u64);
        for i in 0..count {
            let inc = tokio::time::timeout(Duration::from_secs(60), l.next())
                .await
                .map_err(|_| format!("no REQ {i} in 60 s"))?
                .ok_or("the listener ended")?;
            let mut a = AcceptParams::new(Qpn::masked(0x100 + i as u32));
            a.starting_psn = cm.random_psn().await.map_err(|e| e.to_string())?;
            let conn = inc
                .accept(a)
                .await
                .map_err(|e| format!("accept {i}: {e}"))?;
            if conn.established().await.is_ok() {
                established += 1;
            }
            // the peer disconnects
            let _ = conn.closed().await;
            closed += 1;
        }
        // one more round trip through the driver: the last DREP is on the wire before the
        // runtime goes (else the peer's DREQ would wait for it in vain)
        let _ = cm.connection_count().await;
        println!("async listen established {established} closed {closed}");
        Ok(established == count)
    })
}

/// `cm-async-connect`.
pub(crate) fn connect(args: &Args, port: &Port, mut sa: Dev) -> Result<bool, String> {
    let t = Target::resolve(args, port, &mut sa)?;
    let (count, path) = (t.count, t.path);
    let dev = CmDev::open(sa.umad, port)?;
    runtime()?.block_on(async {
        let (cm, _driver) = Cm::bind(SimPort::start(dev, port), config(port));
        let (mut established, mut closed) = (0u64, 0u64);
        let start = Instant::now();
        for i in 0..count {
            let conn = match cm.connect(t.params(i)).await {
                Ok(c) => c,
                Err(e) => {
                    println!("connection {i} failed: {e}");
                    break;
                }
            };
            established += 1;
            let e = conn.disconnect(&[]).await;
            if matches!(
                e,
                ibcm::proto::ConnectionError::Disconnected { by_peer: false, .. }
            ) {
                closed += 1;
            } else {
                println!("connection {i} ended: {e}");
            }
        }
        let st = cm.stats().await.map_err(|e| e.to_string())?;
        println!(
            "async connect established {established} of {count} closed {closed} resent {} \
             path slid {} dlid {} in {} ms",
            st.endpoint.retransmits,
            path.slid.0,
            path.dlid.0,
            start.elapsed().as_millis()
        );
        Ok(established == count && closed == count)
    })
}
