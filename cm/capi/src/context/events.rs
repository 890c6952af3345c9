//! What happens to the handles, as events: [`Shared`]'s bookkeeping of each handle's entry
//! and context pointer, the final events (exactly one per handle), the requests a listener
//! delivers, and the tasks that follow a connection to its end.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use ibcm::rt::{CmError, Incoming, IncomingKind, Listener, PendingConnection};
use ibcm_mad::cma::CmaHeader;
use ibcm_mad::{RejReason, ServiceId};
use tokio::sync::oneshot;

use super::{lock, transport_code, Active, Entry, Open, Shared, NEXT_HANDLE};
use crate::error::{Error, Result};
use crate::event::{ConnParam, Event};
use crate::ffi::types::ibcm_event_type::*;
use crate::ffi::types::ibcm_status::*;
use ibcm::qp_attr::Side;

impl Shared {
    /// A new handle, with the application's context pointer (0: none).
    pub(super) fn new_handle(&self, context: usize) -> u64 {
        let h = NEXT_HANDLE.fetch_add(1, Ordering::Relaxed);
        if context != 0 {
            lock(&self.user).insert(h, context);
        }
        h
    }

    /// Queues `ev`, with its handle's context pointer.
    pub(super) fn push(&self, mut ev: Event) {
        if ev.conn != 0 {
            ev.context = lock(&self.user).get(&ev.conn).copied().unwrap_or(0);
        }
        self.events.push(ev);
    }

    /// Ends handle `h` with its final event; the handle stays (ended) until the application
    /// acknowledges that event ([`Shared::acknowledged`]).
    /// A handle that has ended already (or is unknown) gets no second final event.
    pub(super) fn finish(&self, h: u64, ev: Event) {
        let mut conns = lock(&self.conns);
        let Some(e) = conns.get_mut(&h) else {
            return;
        };
        let open = match std::mem::replace(e, Entry::Ended(None)) {
            Entry::Open(o) => Some(o),
            Entry::Ended(o) => {
                *e = Entry::Ended(o);
                return;
            }
            _ => None,
        };
        *e = Entry::Ended(open);
        // Queued under the table's lock: the sweep of `service_gone` sees the handle ended
        // and its event queued, or neither.
        self.push(ev);
    }

    /// Queues a non-final event of handle `h`, unless the handle has ended meanwhile.
    pub(super) fn push_live(&self, h: u64, ev: Event) {
        let conns = lock(&self.conns);
        if matches!(conns.get(&h), Some(e) if !matches!(e, Entry::Ended(_))) {
            self.push(ev);
        }
    }

    /// The node service connection is gone: every handle not ended yet gets its final event
    /// (status `IBCM_EGONE`), then `SERVICE_GONE` is queued as the context's last event and
    /// the queue is closed: once it is drained, every call on the context (but acknowledging,
    /// the fd and closing) fails with `IBCM_EGONE` at once,
    /// a blocked `ibcm_wait_event` included.
    pub(super) fn service_gone(&self, why: String) {
        let mut conns = lock(&self.conns);
        let mut live: Vec<u64> = conns
            .iter()
            .filter(|(_, e)| !matches!(e, Entry::Ended(_)))
            .map(|(h, _)| *h)
            .collect();
        live.sort_unstable();
        for h in live {
            let Some(e) = conns.get_mut(&h) else {
                continue;
            };
            let (kind, open) = match std::mem::replace(e, Entry::Ended(None)) {
                Entry::Open(o) => (IBCM_EVENT_DISCONNECTED, Some(o)),
                _ => (IBCM_EVENT_CONNECT_ERROR, None),
            };
            let mut ev = Event::new(kind, h);
            ev.comm_id = open.as_ref().map_or(0, |o| o.conn.id().0);
            ev.status = IBCM_EGONE;
            ev.reason = "ended here: the node service connection is gone".into();
            *e = Entry::Ended(open);
            self.push(ev);
        }
        let mut ev = Event::new(IBCM_EVENT_SERVICE_GONE, 0);
        ev.status = IBCM_EGONE;
        ev.reason = why;
        self.push(ev);
        self.events.close();
    }

    /// The application acknowledged the final event of handle `h`: the handle is forgotten.
    pub(crate) fn acknowledged(&self, h: u64) {
        self.forget_if(h, |e| matches!(e, Entry::Ended(_)));
    }

    /// The application acknowledged the `SIDR_REQUEST` event of handle `h`: if it has not
    /// answered it, the request is rejected (dropping it answers "rejected") and the handle
    /// forgotten, so that no unanswered request outlives its event.
    pub(crate) fn sidr_acknowledged(&self, h: u64) {
        self.forget_if(h, |e| matches!(e, Entry::SidrIn(_)));
    }

    /// Forgets handle `h` at once (an answered SIDR request: it has no final event).
    pub(super) fn forget(&self, h: u64) {
        self.forget_if(h, |_| true);
    }

    /// Forgets handle `h` (its entry and its context pointer) if its entry is `which`.
    fn forget_if(&self, h: u64, which: impl FnOnce(&Entry) -> bool) {
        let mut conns = lock(&self.conns);
        if conns.get(&h).is_some_and(which) {
            conns.remove(&h);
            lock(&self.user).remove(&h);
        }
    }

    /// A REQ or a SIDR_REQ reached a listener whose context pointer is `context`: a new
    /// handle and its event.
    pub(super) fn incoming(&self, inc: Incoming, context: usize) {
        let h = self.new_handle(context);
        let (ev, entry) = match inc.kind() {
            IncomingKind::Connect(req) => {
                let req = req.clone();
                let mut ev = Event::new(IBCM_EVENT_CONNECT_REQUEST, h);
                ev.service_id = req.service_id().0;
                ev.transport = transport_code(req.transport());
                ev.remote_qpn = req.remote_qpn().get();
                ev.remote_psn = req.remote_starting_psn().get();
                ev.conn_param = ConnParam::of_req(&req.req);
                ev.peer = crate::params::peer_string(&req.peer);
                ev.private_data = req.user_private_data().to_vec();
                if let Some(cma) = &req.cma_header {
                    ev.rdma_cm = Some(rdma_cm_addrs(cma, req.service_id()));
                }
                let entry = Entry::Incoming {
                    inc: Box::new(inc),
                    req,
                };
                (ev, entry)
            }
            IncomingKind::Sidr(s) => {
                let mut ev = Event::new(IBCM_EVENT_SIDR_REQUEST, h);
                ev.service_id = s.service_id.0;
                ev.peer = crate::params::peer_string(&s.peer);
                let cma = s
                    .service_id
                    .rdma_cm_port()
                    .and_then(|_| CmaHeader::parse(&s.private_data).ok());
                ev.private_data = match &cma {
                    Some(_) => CmaHeader::user_data(&s.private_data).to_vec(),
                    None => s.private_data.clone(),
                };
                ev.rdma_cm = cma.map(|c| rdma_cm_addrs(&c, s.service_id));
                (ev, Entry::SidrIn(Box::new(inc)))
            }
        };
        let mut conns = lock(&self.conns);
        conns.insert(h, entry);
        self.push(ev);
    }

    /// A connection of handle `h` is accepted or established: keep it and watch it.
    /// An `ibcm_disconnect` that came while the handle was busy is carried out now.
    pub(super) fn opened(self: &Arc<Self>, h: u64, open: Open, established: bool) {
        let conn = open.conn.clone();
        let remote_qpn = match open.side {
            Side::Active => conn.rep().map_or(0, |r| r.remote_qpn.get()),
            Side::Passive => open.req.local_qpn.get(),
        };
        // The active side's ESTABLISHED carries the REP's parameters (as rdma_cm's does); the
        // passive side's none.
        let conn_param = match open.side {
            Side::Active => ConnParam::of_rep(&open.rep),
            Side::Passive => ConnParam::default(),
        };
        // The active side's ESTABLISHED carries the REP's private data (as rdma_cm's does),
        // the passive side's the RTU's (known once the connection is established).
        let rep_private_data = match open.side {
            Side::Active => Some(open.rep.private_data.as_bytes().to_vec()),
            Side::Passive => None,
        };
        let id = conn.id().0;
        let of = conn.clone();
        let established_event = move || {
            let mut ev = Event::new(IBCM_EVENT_ESTABLISHED, h);
            ev.comm_id = id;
            ev.remote_qpn = remote_qpn;
            ev.conn_param = conn_param;
            ev.private_data = rep_private_data
                .clone()
                .unwrap_or_else(|| of.rtu_private_data());
            ev
        };
        let queued = {
            let mut conns = lock(&self.conns);
            let queued = match conns.get_mut(&h) {
                Some(Entry::Busy { disconnect }) => disconnect.take(),
                // Ended meanwhile (the node service is gone), or the context is closing.
                _ => return,
            };
            conns.insert(h, Entry::Open(Box::new(open)));
            if established {
                self.push(established_event());
            }
            queued
        };
        let s = self.clone();
        tokio::spawn(async move {
            if let Some(pd) = queued {
                let c = conn.clone();
                tokio::spawn(async move { c.disconnect(&pd).await });
            }
            if !established {
                if let Err(why) = conn.established().await {
                    s.finish(h, Event::ended(h, id, false, &why));
                    return;
                }
                s.push_live(h, established_event());
            }
            // Its LAPs, while the context answers them, until it ends.
            let why = s.follow(h, &conn).await;
            s.finish(h, Event::ended(h, id, true, &why));
        });
    }

    /// The end of an `ibcm_connect`'s wait for the REP (`None`: cancelled).
    /// A connect cancelled by ibcm_disconnect before its REP: its final event.
    pub(super) fn cancelled(&self, h: u64) {
        let mut ev = Event::new(IBCM_EVENT_CONNECT_ERROR, h);
        ev.status = IBCM_ECLOSED;
        ev.reason = "cancelled by ibcm_disconnect".into();
        self.finish(h, ev);
    }

    /// A connect to `to` whose path could not be had (no REQ was sent): its final event,
    /// `CONNECT_ERROR` with the error's code (`IBCM_ENOPATH`, `IBCM_EUNSUPPORTED`, …).
    pub(super) fn path_failed(&self, h: u64, to: ibcm::sa::PathTarget, e: CmError) {
        let e = Error::from(e);
        let mut ev = Event::new(IBCM_EVENT_CONNECT_ERROR, h);
        ev.status = e.code;
        ev.reason = format!("path to {to}: {}", e.msg);
        self.finish(h, ev);
    }

    pub(super) async fn connected(
        self: Arc<Self>,
        h: u64,
        r: Option<std::result::Result<PendingConnection, CmError>>,
        manual: bool,
        active: Active,
    ) {
        let cancelled = |s: &Self| s.cancelled(h);
        let p = match r {
            None => return cancelled(&self),
            Some(Err(CmError::Connection(why))) => {
                return self.finish(h, Event::ended(h, 0, false, &why));
            }
            Some(Err(e)) => {
                let e = Error::from(e);
                let mut ev = Event::new(IBCM_EVENT_CONNECT_ERROR, h);
                ev.status = e.code;
                ev.reason = e.msg;
                return self.finish(h, ev);
            }
            Some(Ok(p)) => p,
        };
        {
            let mut conns = lock(&self.conns);
            let live = matches!(conns.get(&h), Some(Entry::Connecting { cancel: Some(_) }));
            if !live {
                drop(conns);
                // Dropping the pending connection rejects the REP (REJ 28).
                drop(p);
                return cancelled(&self);
            }
            if manual {
                let mut ev = Event::new(IBCM_EVENT_CONNECT_RESPONSE, h);
                ev.comm_id = p.id().0;
                ev.remote_qpn = p.rep().remote_qpn.get();
                ev.remote_psn = p.rep().rep.starting_psn.get();
                ev.conn_param = ConnParam::of_rep(&p.rep().rep);
                ev.private_data = p.rep().rep.private_data.as_bytes().to_vec();
                conns.insert(h, Entry::Pending(Box::new(p), active));
                drop(conns);
                self.push(ev);
                return;
            }
            conns.insert(h, Entry::Busy { disconnect: None });
        }
        self.establish_pending(h, p, active, Vec::new()).await.ok();
    }

    /// Sends the RTU of `p`; its end (established, or the final event) is queued.
    pub(super) async fn establish_pending(
        self: &Arc<Self>,
        h: u64,
        p: PendingConnection,
        active: Active,
        private_data: Vec<u8>,
    ) -> Result<()> {
        let (req, rep) = (*p.req(), p.rep().rep);
        let id = p.id().0;
        match p.establish(&private_data).await {
            Ok(conn) => {
                let open = Open::new(conn, req, rep, Side::Active, Some(active));
                self.opened(h, open, true);
                Ok(())
            }
            Err(e) => {
                let ev = match &e {
                    CmError::Connection(why) => Event::ended(h, id, false, why),
                    _ => {
                        let mut ev = Event::new(IBCM_EVENT_CONNECT_ERROR, h);
                        ev.comm_id = id;
                        ev.status = IBCM_ECLOSED;
                        ev.reason = format!("the RTU could not be sent: {e}");
                        ev
                    }
                };
                self.finish(h, ev);
                Err(e.into())
            }
        }
    }
}

/// The rdma_cm source and destination ("IP:PORT") of a CMA header sent to `sid`.
pub(super) fn rdma_cm_addrs(cma: &CmaHeader, sid: ServiceId) -> (String, String) {
    let src = SocketAddr::new(cma.src, cma.src_port);
    let port = sid.rdma_cm_port().map_or(0, |(_, p)| p);
    (src.to_string(), SocketAddr::new(cma.dst, port).to_string())
}

/// The listener's task: each REQ or SIDR_REQ becomes a handle (with the listener's context
/// pointer) and an event, until `stop`.
pub(super) async fn pump(
    shared: Arc<Shared>,
    mut listener: Listener,
    mut stop: oneshot::Receiver<()>,
    context: usize,
) {
    loop {
        tokio::select! {
            inc = listener.next() => match inc {
                Some(inc) => shared.incoming(inc, context),
                None => return,
            },
            _ = &mut stop => return,
        }
    }
}

/// The final event of a handle this side rejected.
pub(super) fn rejected_locally(h: u64, reason: RejReason) -> Event {
    let mut ev = Event::new(IBCM_EVENT_CONNECT_ERROR, h);
    ev.status = IBCM_ECLOSED;
    ev.rej_reason = reason.raw();
    ev.reason = format!("rejected locally: {reason} ({})", reason.raw());
    ev
}
