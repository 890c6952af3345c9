//! The SA client's tokio side: a task that owns an [`SaClient`] and a transport, and a cheap
//! cloneable handle ([`Sa`]) whose calls wait for their answers.
//!
//! The task sends what the client has to send to the SA's address (LID-routed: no GRH, QP1,
//! Q_Key 0x8001_0000, the SM's SL and P_Key index), feeds it every received MAD of class
//! 0x03, runs its timer and answers each waiting call with its query's result. It ends when
//! every [`Sa`] handle is dropped, or when the transport fails.
//!
//! On a Linux port the transport is [`UmadTransport::open_sa`]: an agent of class 0x03 that
//! receives answers only; [`Sa::open`] opens it and can watch the port for an SM change.
//!
//! # An SM change
//! The SA moves with the master SM, and the paths it gave may no longer hold when a new SM
//! has swept the fabric (the kernel's `ib_sa` re-reads the SM's address on the port events
//! `IB_EVENT_SM_CHANGE`, `LID_CHANGE`, `CLIENT_REREGISTER`, `PKEY_CHANGE` and
//! `PORT_ACTIVE`). Port events come from a verbs device; the client has none, so [`Sa::open`]
//! with a watch interval re-reads the port's sysfs attributes (SM LID and SL, the port's LID,
//! LMC, P_Key 0) that often, and on a change calls [`SaClient::port_changed`]: the port's
//! cached paths are forgotten and requests go to the new SM. An application that gets the
//! port events from verbs says so with [`Sa::port_changed`] instead.
//!
//! ```no_run
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use ibcm::rt::sa::Sa;
//! use ibcm::rt::umad::IbPort;
//! use ibcm::sa::SaConfig;
//! let dev = "/dev/infiniband/umad0";
//! let port = IbPort::of_umad(dev)?;
//! let sa = Sa::open(dev, &port, SaConfig::new(port.port, port.sm_lid), Some(Duration::from_secs(1)))?;
//! let path = sa.resolve(port.gid, port.gid, port.pkey0, Default::default()).await?;
//! # let _ = path; Ok(()) }
//! ```
//!
//! [`UmadTransport::open_sa`]: super::UmadTransport::open_sa

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ibcm_mad::sa::PathRecord;
use ibcm_mad::{Gid, Pkey, Qpn, U4};
use tokio::sync::{mpsc, oneshot};

use super::umad::{IbPort, UmadError, UmadTransport};
use super::{now, sleep_until, DatagramTransport};
use crate::proto::{IbAddr, PeerAddr};
use crate::sa::{
    PathQuery, QueryId, Resolve, SaClient, SaConfig, SaDest, SaError, SaEvent, SaStats,
};

mod paths;

#[cfg(test)]
pub(crate) use paths::test_port;
pub use paths::{PathError, PathResolver, ALTERNATE_CANDIDATES};

/// A handle on an SA client task ([`Sa::spawn`]); clones share the task.
#[derive(Debug, Clone)]
pub struct Sa {
    tx: mpsc::Sender<Cmd>,
}

#[derive(Debug)]
enum Cmd {
    Query(PathQuery, oneshot::Sender<Result<Vec<PathRecord>, SaError>>),
    Resolve {
        sgid: Gid,
        dgid: Gid,
        pkey: Pkey,
        sl: U4,
        reply: oneshot::Sender<Result<PathRecord, SaError>>,
    },
    Stats(oneshot::Sender<SaStats>),
    PortChanged(SaDest),
}

/// The port a client watches ([`Sa::open`]): its umad device, how often its sysfs
/// attributes are read, and what they were last time.
#[derive(Debug)]
struct Watch {
    umad: PathBuf,
    every: Duration,
    last: IbPort,
}

impl Watch {
    /// The port as sysfs says now, if that is another SM or other addresses than last time.
    fn changed(&mut self) -> Option<&IbPort> {
        let now = IbPort::of_umad(&self.umad).ok()?;
        let same = (now.sm_lid, now.sm_sl, now.lid, now.lmc, now.pkey0)
            == (
                self.last.sm_lid,
                self.last.sm_sl,
                self.last.lid,
                self.last.lmc,
                self.last.pkey0,
            );
        self.last = now;
        (!same).then_some(&self.last)
    }
}

/// A call waiting for a query's result.
#[derive(Debug)]
enum Waiter {
    All(oneshot::Sender<Result<Vec<PathRecord>, SaError>>),
    First(oneshot::Sender<Result<PathRecord, SaError>>),
}

/// The error of a call whose task has ended.
fn gone() -> SaError {
    SaError::Cancelled
}

impl Sa {
    /// Spawns the task (on the current tokio runtime) over `client` and `transport`.
    pub fn spawn<T: DatagramTransport>(client: SaClient, transport: T) -> Self {
        let (tx, rx) = mpsc::channel(256);
        tokio::spawn(run(client, transport, rx, None));
        Sa { tx }
    }

    /// Opens the SA agent on the InfiniBand port `port` of umad device `umad`
    /// ([`UmadTransport::open_sa`], each attempt waiting `cfg.timeout`) and spawns the client
    /// with `cfg`, its SA at the port's SM (`port.sm_lid`, `port.sm_sl`). With `watch`, the
    /// port's sysfs attributes are read again that often, and a new SM (LID or SL), a new LID
    /// or LMC or P_Key 0 of the port flushes the port's cached paths and retargets the client
    /// ([`SaClient::port_changed`]; counted in [`SaStats::port_changes`]).
    ///
    /// # Errors
    /// [`UmadError`] from opening the agent.
    pub fn open(
        umad: impl AsRef<Path>,
        port: &IbPort,
        mut cfg: SaConfig,
        watch: Option<Duration>,
    ) -> Result<Self, UmadError> {
        let umad = umad.as_ref();
        cfg.dest.lid = port.sm_lid;
        cfg.dest.sl = U4::masked(port.sm_sl);
        let timeout_ms = u32::try_from(cfg.timeout.as_millis()).unwrap_or(u32::MAX);
        let t = UmadTransport::open_sa(umad, timeout_ms, port.gid)?;
        let client = SaClient::new(cfg, std::process::id());
        let watch = watch.map(|every| Watch {
            umad: umad.to_path_buf(),
            every,
            last: port.clone(),
        });
        let (tx, rx) = mpsc::channel(256);
        tokio::spawn(run(client, t, rx, watch));
        Ok(Sa { tx })
    }

    /// Tells the client that the port's SM or addresses changed (from the verbs port events
    /// `IBV_EVENT_SM_CHANGE`, `LID_CHANGE`, `CLIENT_REREGISTER`, `PKEY_CHANGE`,
    /// `PORT_ACTIVE`): the port's cached paths are forgotten and requests go to `dest`
    /// ([`SaClient::port_changed`]). Nothing happens once the task has ended.
    pub async fn port_changed(&self, dest: SaDest) {
        let _ = self.tx.send(Cmd::PortChanged(dest)).await;
    }

    /// Every PathRecord the query's answer holds (one for a Get).
    ///
    /// # Errors
    /// The query's [`SaError`]; [`SaError::Cancelled`] when the task has ended.
    pub async fn path_records(&self, q: PathQuery) -> Result<Vec<PathRecord>, SaError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Cmd::Query(q, reply))
            .await
            .map_err(|_| gone())?;
        rx.await.unwrap_or_else(|_| Err(gone()))
    }

    /// The path to `dgid` (partition `pkey`, service level `sl`) from `sgid`: from the cache,
    /// or by a Get whose answer is cached ([`SaClient::resolve`]).
    ///
    /// # Errors
    /// The query's [`SaError`]; [`SaError::Cancelled`] when the task has ended.
    pub async fn resolve(
        &self,
        sgid: Gid,
        dgid: Gid,
        pkey: Pkey,
        sl: U4,
    ) -> Result<PathRecord, SaError> {
        let (reply, rx) = oneshot::channel();
        let cmd = Cmd::Resolve {
            sgid,
            dgid,
            pkey,
            sl,
            reply,
        };
        self.tx.send(cmd).await.map_err(|_| gone())?;
        rx.await.unwrap_or_else(|_| Err(gone()))
    }

    /// The client's counters; `None` when the task has ended.
    pub async fn stats(&self) -> Option<SaStats> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(Cmd::Stats(reply)).await.ok()?;
        rx.await.ok()
    }
}

/// The address SA MADs go to.
fn sa_addr(d: &SaDest) -> PeerAddr {
    PeerAddr::Ib(IbAddr {
        lid: d.lid,
        gid: None,
        qpn: Qpn::masked(1),
        qkey: d.qkey,
        sl: d.sl.get(),
        pkey_index: d.pkey_index,
    })
}

async fn run<T: DatagramTransport>(
    mut client: SaClient,
    mut transport: T,
    mut rx: mpsc::Receiver<Cmd>,
    mut watch: Option<Watch>,
) {
    let mut waiters: HashMap<QueryId, Vec<Waiter>> = HashMap::new();
    let mut next_look = watch.as_ref().map(|w| now() + w.every);
    loop {
        while let Some(tx) = client.poll_transmit() {
            // A failed send is retried by the client's timer like a lost one.
            let _ = transport.send(sa_addr(&tx.dest), &tx.mad).await;
        }
        while let Some(SaEvent::PathRecords { id, result }) = client.poll_event() {
            for w in waiters.remove(&id).unwrap_or_default() {
                match w {
                    Waiter::All(r) => {
                        let _ = r.send(result.clone());
                    }
                    Waiter::First(r) => {
                        let first = result.clone().and_then(|v| {
                            v.first().copied().ok_or(SaError::Status {
                                sa: ibcm_mad::sa::SaStatus::NoRecords,
                                mad_status: 0x0300,
                            })
                        });
                        let _ = r.send(first);
                    }
                }
            }
        }
        let deadline = client.poll_timeout();
        tokio::select! {
            cmd = rx.recv() => match cmd {
                None => return,
                Some(Cmd::Query(q, reply)) => {
                    let id = client.query(&q, now());
                    waiters.entry(id).or_default().push(Waiter::All(reply));
                }
                Some(Cmd::Resolve { sgid, dgid, pkey, sl, reply }) => {
                    match client.resolve(sgid, dgid, pkey, sl, now()) {
                        Resolve::Cached(p) => {
                            let _ = reply.send(Ok(p));
                        }
                        Resolve::Pending(id) => waiters.entry(id).or_default().push(Waiter::First(reply)),
                    }
                }
                Some(Cmd::Stats(reply)) => {
                    let _ = reply.send(client.stats());
                }
                Some(Cmd::PortChanged(dest)) => client.port_changed(dest),
            },
            r = transport.recv() => match r {
                Ok((_from, mad)) => {
                    if mad.get(1) == Some(&0x03) {
                        client.handle_mad(&mad, now());
                    }
                }
                Err(_) => return,
            },
            () = sleep_until(deadline) => client.handle_timeout(now()),
            () = sleep_until(next_look), if next_look.is_some() => {
                if let Some(w) = watch.as_mut() {
                    // A few small sysfs files, read in place.
                    if let Some(p) = w.changed() {
                        let dest = SaDest {
                            lid: p.sm_lid,
                            sl: U4::masked(p.sm_sl),
                            ..client.config().dest
                        };
                        client.port_changed(dest);
                    }
                    next_look = Some(now() + w.every);
                }
            }
        }
    }
}

/// A fake SA for tests: answers PathRecord queries over a [`MemNetwork`](crate::rt::MemNetwork).
#[cfg(test)]
pub(crate) mod test_sa {
    use std::time::Duration;

    use ibcm_mad::sa::{PathRecord, SaMad};
    use ibcm_mad::{Gid, Lid, Method, Pkey, Tid};
    use tokio::sync::mpsc;

    use super::{sa_addr, Sa};
    use crate::proto::{IbAddr, PeerAddr};
    use crate::rt::{DatagramTransport, MemNetwork, MemTransport};
    use crate::sa::{SaClient, SaConfig};

    /// fe80::`n`.
    pub(crate) fn gid(n: u16) -> Gid {
        let mut g = [0u8; 16];
        g[0] = 0xfe;
        g[1] = 0x80;
        g[14..].copy_from_slice(&n.to_be_bytes());
        Gid(g)
    }

    /// How the fake SA answers.
    #[derive(Debug, Clone, Default)]
    pub(crate) struct FakeSa {
        /// Requests dropped before the first answered (`usize::MAX`: never answers).
        pub(crate) drop: usize,
        /// Answer OK with no record.
        pub(crate) empty: bool,
        /// The P_Key of every path (default: the template's, or 0xFFFF).
        pub(crate) pkey: Option<Pkey>,
        /// The ports have two LIDs each (LMC 1: the local port 2 and 3, the remote port D
        /// and D + 1): a GetTable is answered with the paths 2 → D, 2 → D + 1 and 3 → D + 1
        /// (one MAD, AttributeOffset 8). Otherwise a GetTable gets the one path a Get does.
        pub(crate) lmc: bool,
    }

    /// The fake SA at LID 1: answers a PathRecord query from the local port at LID 2 with the
    /// path its template asks for (SLID 2; DLID the template's, or the DGID's last two
    /// bytes), ERR_NO_RECORDS for a DLID of 0x100 and above; counts requests on `seen`.
    pub(crate) async fn serve(mut t: MemTransport, f: FakeSa, seen: mpsc::UnboundedSender<()>) {
        let mut n = 0;
        while let Ok((from, mad)) = t.recv().await {
            let _ = seen.send(());
            n += 1;
            if n <= f.drop {
                continue;
            }
            let Ok(q) = SaMad::parse(&mad) else { continue };
            let tmpl = PathRecord::parse(&q.data).unwrap_or_default();
            let dlid = match tmpl.dlid.0 {
                0 => u16::from_be_bytes([tmpl.dgid.0[14], tmpl.dgid.0[15]]),
                l => l,
            };
            let rec = PathRecord {
                sgid: if tmpl.sgid == Gid::ZERO {
                    gid(2)
                } else {
                    tmpl.sgid
                },
                dgid: if tmpl.dgid == Gid::ZERO {
                    gid(dlid)
                } else {
                    tmpl.dgid
                },
                slid: Lid(2),
                dlid: Lid(dlid),
                pkey: f.pkey.unwrap_or(if tmpl.pkey.0 == 0 {
                    Pkey(0xffff)
                } else {
                    tmpl.pkey
                }),
                sl: tmpl.sl,
                reversible: true,
                packet_life_time: 18,
                ..PathRecord::default()
            };
            let mut a = q.clone();
            a.header.method = Method::from_raw(q.header.method.raw() | 0x80);
            a.header.tid = Tid(q.header.tid.0 | 0x0001_0000_0000_0000);
            a.data = [0; 200];
            let table = q.header.method == ibcm_mad::sa::method::GET_TABLE;
            if dlid >= 0x100 {
                a.header.status = 0x0300;
            } else if f.lmc && table && !f.empty {
                a.attr_offset = 8;
                let lids = [(2, dlid), (2, dlid + 1), (3, dlid + 1)];
                for (i, (s, d)) in lids.into_iter().enumerate() {
                    let r = PathRecord {
                        slid: Lid(s),
                        dlid: Lid(d),
                        ..rec
                    };
                    a.data[i * 64..(i + 1) * 64].copy_from_slice(&r.to_bytes());
                }
            } else if !f.empty {
                a.data[..64].copy_from_slice(&rec.to_bytes());
            }
            let _ = t.send(from, &a.to_bytes()).await;
        }
    }

    /// An [`Sa`] task of the port at LID 2 on a network of its own, with `f` at LID 1 (each
    /// attempt waits `timeout`, 3 retries); the receiver counts the SA's requests.
    pub(crate) fn spawn(f: FakeSa, timeout: Duration) -> (Sa, mpsc::UnboundedReceiver<()>) {
        let net = MemNetwork::new();
        let mut cfg = SaConfig::new(1, Lid(1));
        cfg.timeout = timeout;
        let sa_t = net.transport(sa_addr(&cfg.dest));
        let me = net.transport(PeerAddr::Ib(IbAddr {
            lid: Lid(2),
            ..IbAddr::roce(gid(2))
        }));
        let (seen_tx, seen) = mpsc::unbounded_channel();
        tokio::spawn(serve(sa_t, f, seen_tx));
        (Sa::spawn(SaClient::new(cfg, 7), me), seen)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ibcm_mad::sa::method;
    use ibcm_mad::{Lid, Tid};

    use super::*;

    fn gid(n: u8) -> Gid {
        test_sa::gid(u16::from(n))
    }

    fn setup(drop: usize) -> (Sa, mpsc::UnboundedReceiver<()>) {
        let f = test_sa::FakeSa {
            drop,
            ..test_sa::FakeSa::default()
        };
        test_sa::spawn(f, Duration::from_millis(100))
    }

    #[tokio::test(start_paused = true)]
    async fn a_query_is_answered_and_resolve_caches() {
        let (sa, mut seen) = setup(0);
        let recs = sa
            .path_records(PathQuery::by_gids(gid(2), gid(5), Pkey(0xffff)))
            .await
            .unwrap();
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0].dlid, Lid(5));
        let sl = U4::masked(0);
        let p = sa.resolve(gid(2), gid(6), Pkey(0xffff), sl).await.unwrap();
        assert_eq!(p.dlid, Lid(6));
        let again = sa.resolve(gid(2), gid(6), Pkey(0xffff), sl).await.unwrap();
        assert_eq!(again, p);
        let mut n = 0;
        while seen.try_recv().is_ok() {
            n += 1;
        }
        assert_eq!(n, 2, "the second resolve came from the cache");
        let st = sa.stats().await.unwrap();
        assert_eq!((st.cache_hits, st.cache_misses, st.answered), (1, 1, 2));
    }

    #[tokio::test(start_paused = true)]
    async fn lost_requests_are_resent_and_all_lost_times_out() {
        let (sa, _seen) = setup(2);
        let q = PathQuery {
            table: false,
            ..PathQuery::by_lids(Lid(2), Lid(9))
        };
        assert_eq!(q.to_mad(Tid(0)).header.method, method::GET);
        let t0 = tokio::time::Instant::now();
        let recs = sa.path_records(q).await.unwrap();
        assert_eq!(recs.len(), 1);
        // two attempts lost: answered on the third, 200 ms later
        assert_eq!(t0.elapsed(), Duration::from_millis(200));
        let st = sa.stats().await.unwrap();
        assert_eq!((st.sent, st.resent), (3, 2));

        let (sa, _seen) = setup(usize::MAX);
        let e = sa
            .path_records(PathQuery::by_lids(Lid(2), Lid(9)))
            .await
            .unwrap_err();
        assert_eq!(e, SaError::Timeout { attempts: 4 });
    }

    #[tokio::test(start_paused = true)]
    async fn a_port_change_flushes_the_cache_and_retargets_the_client() {
        let net = crate::rt::MemNetwork::new();
        let mut cfg = SaConfig::new(1, Lid(1));
        cfg.timeout = Duration::from_millis(100);
        let old = cfg.dest;
        let new = SaDest { lid: Lid(7), ..old };
        let (old_seen, mut old_rx) = mpsc::unbounded_channel();
        let (new_seen, mut new_rx) = mpsc::unbounded_channel();
        let f = test_sa::FakeSa::default();
        tokio::spawn(test_sa::serve(
            net.transport(sa_addr(&old)),
            f.clone(),
            old_seen,
        ));
        tokio::spawn(test_sa::serve(net.transport(sa_addr(&new)), f, new_seen));
        let me = net.transport(PeerAddr::Ib(IbAddr {
            lid: Lid(2),
            ..IbAddr::roce(gid(2))
        }));
        let sa = Sa::spawn(SaClient::new(cfg, 7), me);
        let sl = U4::masked(0);
        let p = sa.resolve(gid(2), gid(6), Pkey(0xffff), sl).await.unwrap();
        assert_eq!(sa.resolve(gid(2), gid(6), Pkey(0xffff), sl).await, Ok(p));
        assert!(old_rx.try_recv().is_ok() && old_rx.try_recv().is_err());
        // A new SM: the cached path is gone, and the Get goes to the SA at LID 7.
        sa.port_changed(new).await;
        assert_eq!(sa.resolve(gid(2), gid(6), Pkey(0xffff), sl).await, Ok(p));
        assert!(old_rx.try_recv().is_err(), "nothing more to the old SA");
        assert!(new_rx.try_recv().is_ok(), "the Get went to the new SA");
        let st = sa.stats().await.unwrap();
        assert_eq!((st.cache_hits, st.cache_misses, st.port_changes), (1, 2, 1));
    }
}
