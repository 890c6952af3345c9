//! Path migration: a connection's primary and alternate paths ([`Paths`]), the peer's LAPs
//! this context answers (`IBCM_EVENT_LAP`, held in a [`LapSlot`] until ibcm_lap_accept,
//! ibcm_lap_reject or the event's acknowledgement), this side's LAPs (`IBCM_EVENT_APR`,
//! `IBCM_EVENT_LAP_ERROR`), reported migrations, and the QP attributes that load the
//! alternate path.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use ibcm::proto::ConnectionError;
use ibcm::qp_attr::{alt_path_attr, Connection as QpConn, LapRole, Side};
use ibcm::rt::{AprAnswer, CmError, Connection, LapPolicy, LapRequest};
use ibcm_mad::{AprStatus, PathInfo, Req, TimeoutExp};

use super::{lock, Context, Entry, Open, Shared};
use crate::error::{Error, Result};
use crate::event::Event;
use crate::ffi::types::ibcm_event_type::*;
use crate::ffi::types::ibcm_status::*;
use crate::ffi::types::{ibcm_path, ibcm_port, ibcm_qp_attr};
use crate::params;

/// A path as a message carried it, and which end wrote it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Stored {
    path: PathInfo,
    /// `Sender`: written from this side's view (a REQ or LAP this side sent); `Receiver`:
    /// from the peer's (one it received).
    role: LapRole,
    /// The packet life time of the path record it was built from, when this side knows it
    /// (the alternate path of its own REQ).
    life: Option<u8>,
}

impl Stored {
    /// As the C struct, from this side's view.
    fn ours(&self) -> ibcm_path {
        params::path_c(&self.path, self.role == LapRole::Receiver)
    }
}

/// A connection's paths: the REQ's, then as LAP exchanges and migrations change them.
#[derive(Debug, Clone, Copy)]
pub(super) struct Paths {
    primary: Stored,
    alternate: Option<Stored>,
}

impl Paths {
    /// The paths of `req` for this side (`side`); `alt_life`: the packet life time of the
    /// record its alternate path was built from (the active side's, when it asked for one).
    pub(super) fn of(req: &Req, side: Side, alt_life: Option<u8>) -> Self {
        let role = match side {
            Side::Active => LapRole::Sender,
            Side::Passive => LapRole::Receiver,
        };
        Paths {
            primary: Stored {
                path: req.primary_path,
                role,
                life: None,
            },
            alternate: req.alternate_path.is_present().then_some(Stored {
                path: req.alternate_path,
                role,
                life: alt_life,
            }),
        }
    }
}

/// The peer's LAP on a connection, while this side has to answer it.
#[derive(Debug, Default)]
pub(super) enum LapSlot {
    /// None waits.
    #[default]
    None,
    /// Delivered as the LAP event numbered `.0`, waiting for an answer.
    Waiting(u64, Box<LapRequest>),
    /// An answer or an MRA for it is under way (`path`: the LAP's); `acked`: its event was
    /// acknowledged meanwhile (after an MRA, it is rejected then).
    Busy {
        serial: u64,
        acked: bool,
        path: PathInfo,
    },
}

/// ibcm_lap_accept or ibcm_lap_reject.
pub(crate) enum Answer {
    /// APR status 0, with private data.
    Accept(Vec<u8>),
    /// Another status, with additional information and private data.
    Reject {
        status: AprStatus,
        info: Vec<u8>,
        private_data: Vec<u8>,
    },
}

/// The open connection of `h` (accepted or established, not ended), or why not.
fn open_mut<'a>(conns: &'a mut HashMap<u64, Entry>, h: u64, op: &str) -> Result<&'a mut Open> {
    match conns.get_mut(&h) {
        None => Err(Context::unknown(h)),
        Some(Entry::Open(o)) => Ok(o),
        Some(Entry::Ended(_)) => Err(Context::ended(h)),
        Some(Entry::Busy { .. }) => Err(Error::new(IBCM_EBUSY, format!("connection {h} is busy"))),
        Some(_) => Err(Error::new(
            IBCM_ESTATE,
            format!("{op}: connection {h} is not accepted or established"),
        )),
    }
}

/// The open connection of `h`, ended or not (its paths stay until its final event is
/// acknowledged).
fn open_of(e: Option<&mut Entry>) -> Option<&mut Open> {
    match e {
        Some(Entry::Open(o) | Entry::Ended(Some(o))) => Some(o),
        _ => None,
    }
}

impl Shared {
    /// An established connection's LAPs, taken while this context answers them (each an
    /// `IBCM_EVENT_LAP`), until it ends: why it ended.
    pub(super) async fn follow(self: &Arc<Self>, h: u64, conn: &Connection) -> ConnectionError {
        let mut policy = self.lap_policy.subscribe();
        // The client does not take LAPs now (the policy is changing): wait for the change.
        let mut refused = false;
        loop {
            let answering = *policy.borrow_and_update() && !refused;
            tokio::select! {
                why = conn.closed() => return why,
                r = conn.next_lap(), if answering => match r {
                    Ok(lap) => self.lap_arrived(h, lap),
                    Err(CmError::LapsNotDelegated) => refused = true,
                    Err(_) => return conn.closed().await,
                },
                changed = policy.changed() => match changed {
                    Ok(()) => refused = false,
                    // The context is closing.
                    Err(_) => return conn.closed().await,
                },
            }
        }
    }

    /// A LAP for the application: held on its connection, and its event.
    fn lap_arrived(&self, h: u64, lap: LapRequest) {
        let serial = self.laps.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        let mut ev = Event::new(IBCM_EVENT_LAP, h);
        ev.comm_id = lap.id().0;
        ev.path = Some(params::path_c(lap.path(), true));
        ev.private_data = lap.private_data().to_vec();
        ev.lap_serial = serial;
        let mut conns = lock(&self.conns);
        match conns.get_mut(&h) {
            Some(Entry::Open(o)) => {
                o.lap = LapSlot::Waiting(serial, Box::new(lap));
                self.push(ev);
            }
            // Ended meanwhile: nobody will answer it.
            _ => {
                drop(conns);
                reject_soon(Box::new(lap));
            }
        }
    }

    /// The end of this side's LAP exchange on `h` for `path`: the APR, or why none came.
    pub(super) fn lap_done(
        &self,
        h: u64,
        path: PathInfo,
        r: std::result::Result<AprAnswer, CmError>,
    ) {
        let (mut ev, loaded) = match r {
            Ok(a) | Err(CmError::LapRejected(a)) => {
                let mut ev = Event::new(IBCM_EVENT_APR, h);
                ev.apr_status = u32::from(a.status.raw());
                ev.additional_info = a.additional_info;
                ev.private_data = a.private_data;
                (ev, a.status == AprStatus::Success)
            }
            Err(e) => {
                let e = Error::from(e);
                let mut ev = Event::new(IBCM_EVENT_LAP_ERROR, h);
                ev.status = e.code;
                ev.reason = format!("LAP: {}", e.msg);
                (ev, false)
            }
        };
        let mut conns = lock(&self.conns);
        let live = matches!(conns.get(&h), Some(Entry::Open(_)));
        if let Some(o) = open_of(conns.get_mut(&h)) {
            o.lap_sent = false;
            ev.comm_id = o.conn.id().0;
            if loaded {
                o.paths.alternate = Some(Stored {
                    path,
                    role: LapRole::Sender,
                    life: None,
                });
            }
        }
        // After its final event a connection has no more.
        if live {
            self.push(ev);
        }
    }
}

/// Answers `lap` "rejected" on the runtime (a LAP whose event was acknowledged unanswered,
/// or whose connection ended): dropping it would too, but would log it as forgotten.
fn reject_soon(lap: Box<LapRequest>) {
    tokio::spawn(async move {
        let _ = lap.reject(AprStatus::Rejected, &[], &[]).await;
    });
}

impl Context {
    /// `IBCM_EUNSUPPORTED` when the daemon does not serve path migration.
    fn apm(&self, op: &str) -> Result<()> {
        if self.node.serves_path_migration() {
            return Ok(());
        }
        Err(Error::new(
            IBCM_EUNSUPPORTED,
            format!(
                "{op}: the node service does not serve path migration (an ibcmd that predates it)"
            ),
        ))
    }

    /// ibcm_lap_policy: whether this context answers its connections' LAPs (0: the daemon
    /// answers them "unsupported", 1: each comes as an `IBCM_EVENT_LAP`).
    pub(crate) fn lap_policy(&self, policy: i32) -> Result<()> {
        self.live()?;
        let answer = match policy {
            0 => false,
            1 => true,
            p => {
                return Err(Error::new(
                    IBCM_EINVAL,
                    format!("LAP policy {p} (0 IBCM_LAP_UNSUPPORTED, 1 IBCM_LAP_APPLICATION)"),
                ))
            }
        };
        if answer {
            self.apm("ibcm_lap_policy")?;
        }
        let p = if answer {
            LapPolicy::Application
        } else {
            LapPolicy::Unsupported
        };
        self.block_on(self.cm.set_lap_policy(p))??;
        self.shared.lap_policy.send_replace(answer);
        Ok(())
    }

    /// ibcm_load_alt_path: sends the LAP now; its APR (or why none came) is an event.
    pub(crate) fn load_alt_path(
        &self,
        h: u64,
        path: PathInfo,
        private_data: Vec<u8>,
    ) -> Result<()> {
        self.live()?;
        self.apm("ibcm_load_alt_path")?;
        let conn = {
            let mut conns = lock(&self.shared.conns);
            let o = open_mut(&mut conns, h, "ibcm_load_alt_path")?;
            if o.lap_sent {
                return Err(Error::new(
                    IBCM_EBUSY,
                    format!("a LAP of this side waits for its APR on connection {h}"),
                ));
            }
            o.lap_sent = true;
            o.conn.clone()
        };
        let s = self.shared.clone();
        let r = self.spawn(async move {
            let r = conn.load_alt_path(path, &private_data).await;
            s.lap_done(h, path, r);
        });
        if r.is_err() {
            if let Some(o) = open_of(lock(&self.shared.conns).get_mut(&h)) {
                o.lap_sent = false;
            }
        }
        r
    }

    /// ibcm_lap_accept, ibcm_lap_reject: the APR for the LAP waiting on `h`; accepted, its
    /// path is the connection's alternate one.
    pub(crate) fn lap_answer(&self, h: u64, answer: Answer, op: &str) -> Result<()> {
        self.live()?;
        let (serial, lap) = {
            let mut conns = lock(&self.shared.conns);
            let o = open_mut(&mut conns, h, op)?;
            match std::mem::take(&mut o.lap) {
                LapSlot::Waiting(serial, lap) => {
                    o.lap = LapSlot::Busy {
                        serial,
                        acked: false,
                        path: *lap.path(),
                    };
                    (serial, lap)
                }
                busy @ LapSlot::Busy { .. } => {
                    o.lap = busy;
                    return Err(Error::new(
                        IBCM_EBUSY,
                        format!("another call on connection {h}'s LAP is in progress"),
                    ));
                }
                LapSlot::None => {
                    return Err(Error::new(
                        IBCM_ESTATE,
                        format!("{op}: no LAP waits for an answer on connection {h}"),
                    ))
                }
            }
        };
        let path = *lap.path();
        let accept = matches!(answer, Answer::Accept(_));
        let r = self.block_on(async move {
            match answer {
                Answer::Accept(pd) => lap.accept(&pd).await,
                Answer::Reject {
                    status,
                    info,
                    private_data,
                } => lap.reject(status, &info, &private_data).await,
            }
        });
        {
            let mut conns = lock(&self.shared.conns);
            if let Some(o) = open_of(conns.get_mut(&h)) {
                if matches!(o.lap, LapSlot::Busy { serial: s, .. } if s == serial) {
                    o.lap = LapSlot::None;
                }
                if accept && matches!(r, Ok(Ok(()))) {
                    o.paths.alternate = Some(Stored {
                        path,
                        role: LapRole::Receiver,
                        life: None,
                    });
                }
            }
        }
        Ok(r??)
    }

    /// ibcm_mra on a connection whose LAP waits for an answer: an MRA for the LAP. `None`
    /// when no LAP waits (the MRA is then for a REQ or a REP).
    pub(super) fn lap_mra(&self, h: u64, t: TimeoutExp) -> Option<Result<()>> {
        let (serial, lap) = {
            let mut conns = lock(&self.shared.conns);
            let Some(Entry::Open(o)) = conns.get_mut(&h) else {
                return None;
            };
            match std::mem::take(&mut o.lap) {
                LapSlot::Waiting(serial, lap) => {
                    o.lap = LapSlot::Busy {
                        serial,
                        acked: false,
                        path: *lap.path(),
                    };
                    (serial, lap)
                }
                busy @ LapSlot::Busy { .. } => {
                    o.lap = busy;
                    return Some(Err(Error::new(
                        IBCM_EBUSY,
                        format!("another call on connection {h}'s LAP is in progress"),
                    )));
                }
                LapSlot::None => return None,
            }
        };
        if let Err(e) = self.live() {
            return Some(Err(e));
        }
        let r = self.block_on(lap.mra(t));
        // Back to wait for its answer, unless its event was acknowledged meanwhile or the
        // connection ended: then it is rejected now.
        let back = {
            let mut conns = lock(&self.shared.conns);
            match conns.get_mut(&h) {
                Some(Entry::Open(o)) => match o.lap {
                    LapSlot::Busy {
                        serial: s,
                        acked: false,
                        ..
                    } if s == serial => {
                        o.lap = LapSlot::Waiting(serial, lap);
                        None
                    }
                    LapSlot::Busy { serial: s, .. } if s == serial => {
                        o.lap = LapSlot::None;
                        Some(lap)
                    }
                    _ => Some(lap),
                },
                _ => Some(lap),
            }
        };
        if let Some(lap) = back {
            let _ = self.spawn(async move {
                let _ = lap.reject(AprStatus::Rejected, &[], &[]).await;
            });
        }
        Some(r.and_then(|r| r.map_err(Error::from)))
    }

    /// The LAP event numbered `serial` of `h` was acknowledged: its LAP, if still unanswered,
    /// is rejected (APR status 3), so that no LAP outlives its event.
    pub(crate) fn lap_acknowledged(&self, h: u64, serial: u64) {
        let lap = {
            let mut conns = lock(&self.shared.conns);
            let Some(o) = open_of(conns.get_mut(&h)) else {
                return;
            };
            match &mut o.lap {
                LapSlot::Waiting(s, _) if *s == serial => match std::mem::take(&mut o.lap) {
                    LapSlot::Waiting(_, lap) => Some(lap),
                    _ => None,
                },
                LapSlot::Busy {
                    serial: s, acked, ..
                } if *s == serial => {
                    *acked = true;
                    None
                }
                _ => None,
            }
        };
        if let Some(lap) = lap {
            let _ = self.spawn(async move {
                let _ = lap.reject(AprStatus::Rejected, &[], &[]).await;
            });
        }
    }

    /// ibcm_path_migrated: the QP of `h` migrated to its alternate path, which is now the
    /// primary one (and there is no alternate until a LAP exchange loads one).
    pub(crate) fn path_migrated(&self, h: u64) -> Result<()> {
        self.live()?;
        self.apm("ibcm_path_migrated")?;
        let conn = open_mut(&mut lock(&self.shared.conns), h, "ibcm_path_migrated")?
            .conn
            .clone();
        self.block_on(conn.notify_path_migrated())??;
        if let Some(o) = open_of(lock(&self.shared.conns).get_mut(&h)) {
            if let Some(a) = o.paths.alternate.take() {
                o.paths.primary = a;
            }
        }
        Ok(())
    }

    /// ibcm_query_path: the primary (`which` 0) or alternate (1) path of `h`, from this
    /// side's view.
    pub(crate) fn query_path(&self, h: u64, which: i32) -> Result<ibcm_path> {
        let alternate = match which {
            0 => false,
            1 => true,
            w => {
                return Err(Error::new(
                    IBCM_EINVAL,
                    format!("path {w} (0 IBCM_PATH_PRIMARY, 1 IBCM_PATH_ALTERNATE)"),
                ))
            }
        };
        self.live()?;
        let paths = {
            let conns = lock(&self.shared.conns);
            match conns.get(&h).ok_or_else(|| Self::unknown(h))? {
                Entry::Open(o) | Entry::Ended(Some(o)) => o.paths,
                Entry::Incoming { req, .. } => Paths::of(&req.req, Side::Passive, None),
                Entry::Pending(p, a) => Paths::of(p.req(), Side::Active, a.alt_packet_life_time),
                Entry::Ended(None) => return Err(Self::ended(h)),
                Entry::Busy { .. } => {
                    return Err(Error::new(IBCM_EBUSY, format!("connection {h} is busy")))
                }
                Entry::Connecting { .. } | Entry::SidrIn(_) => {
                    return Err(Error::new(
                        IBCM_ESTATE,
                        format!(
                            "connection {h} has no paths yet (before its REP, or a SIDR request)"
                        ),
                    ))
                }
            }
        };
        if !alternate {
            return Ok(paths.primary.ours());
        }
        paths
            .alternate
            .map(|a| a.ours())
            .ok_or_else(|| Error::new(IBCM_ESTATE, format!("connection {h} has no alternate path")))
    }

    /// ibcm_init_alt_path_attr: the QP attributes that load the alternate path of `h` (the
    /// LAP's waiting for an answer, else the connection's alternate path).
    pub(crate) fn alt_path_attr(
        &self,
        h: u64,
        port: Option<&ibcm_port>,
    ) -> Result<(ibcm_qp_attr, i32)> {
        self.live()?;
        let (port, link) = params::local_port(port)?;
        let (req, rep, side, active, path) = {
            let conns = lock(&self.shared.conns);
            let o = match conns.get(&h).ok_or_else(|| Self::unknown(h))? {
                Entry::Open(o) | Entry::Ended(Some(o)) => o,
                Entry::Ended(None) => return Err(Self::ended(h)),
                Entry::Busy { .. } => {
                    return Err(Error::new(IBCM_EBUSY, format!("connection {h} is busy")))
                }
                _ => {
                    return Err(Error::new(
                        IBCM_ESTATE,
                        format!("connection {h} is not accepted or established"),
                    ))
                }
            };
            let path = match &o.lap {
                LapSlot::Waiting(_, lap) => Some(Stored {
                    path: *lap.path(),
                    role: LapRole::Receiver,
                    life: None,
                }),
                LapSlot::Busy { path, .. } => Some(Stored {
                    path: *path,
                    role: LapRole::Receiver,
                    life: None,
                }),
                LapSlot::None => o.paths.alternate,
            };
            let path = path.ok_or_else(|| {
                Error::new(
                    IBCM_ESTATE,
                    format!(
                        "connection {h} has no alternate path (none in its REQ, none loaded by \
                         a LAP exchange, no LAP waiting)"
                    ),
                )
            })?;
            (o.req, o.rep, o.side, o.active, path)
        };
        let mut c = QpConn::new(&req, &rep, side, link, port);
        if let Some(a) = active {
            c.retry_count = Some(a.retry_count);
            c.packet_life_time = Some(a.packet_life_time);
        }
        c.alt_packet_life_time = path.life;
        let (a, m) = alt_path_attr(&c, &path.path, path.role)
            .map_err(|e| Error::new(IBCM_EINVAL, e.to_string()))?;
        let t = c
            .qp_type()
            .ok_or_else(|| Error::new(IBCM_EINVAL, "the REQ's transport has no connected QP"))?;
        Ok(params::qp_attr_c(&a, m, t))
    }
}
