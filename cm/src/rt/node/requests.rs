//! The requests of a session ([`NodeServer::on_request`]): each checked against the
//! session's own tables, fed into the driver, answered.

use std::sync::Arc;

use ibcm_mad::{RejReason, ServiceId};
use tokio::sync::mpsc;

use super::client::transport_of;
use super::hooks::EventSink;
use super::proto::{
    sid, texp, ClientMsg, DaemonMsg, Op, WireCallError, WireConnectError, WireReq, WireResult,
    WireStatelessInfo, VERSION,
};
use super::server::{lock, ConnEntry, NodeServer, Session};
use crate::proto::{ConnId, ListenOptions, StatelessAccept, StatelessInfo};
use crate::rt::command::Command;
use crate::rt::slot::SlotRef;
use crate::rt::types::IncomingKind;

impl NodeServer {
    pub(super) fn reply(s: &Session, seq: u64, result: WireResult) {
        s.out.push(&DaemonMsg::Reply { seq, result });
    }

    /// Whether `conn` is the session's.
    fn owns(s: &Session, conn: u32) -> bool {
        s.lock().conns.contains_key(&conn)
    }

    pub(super) async fn on_request(self: &Arc<Self>, s: &Arc<Session>, m: ClientMsg) {
        let seq = m.seq;
        if let Err(why) = super::fields::check(&m.op) {
            // A reject that does not fit still rejects the REQ (REJ 28), as the endpoint
            // does with one whose data it cannot carry.
            if let Op::Reject { conn, .. } = m.op {
                let mine = s.lock().conns.get(&conn).is_some_and(|c| c.unanswered);
                if mine {
                    s.lock().remove_conn(conn);
                    self.cm.send(Command::Unanswered {
                        id: ibcm_mad::CommId(conn),
                        sidr: false,
                    });
                }
            }
            Self::reply(s, seq, WireResult::Refused { why });
            return;
        }
        let not_yours =
            |conn: u32| WireResult::CallError(WireCallError::UnknownConnection { conn });
        let r = match m.op {
            Op::Hello { version, addr } if version == VERSION => {
                if addr {
                    WireResult::Hello {
                        addr: self.cfg.addr,
                        paths: u32::try_from(self.cfg.max_path_queries).unwrap_or(u32::MAX),
                        apm: u32::try_from(self.cfg.max_laps).unwrap_or(u32::MAX),
                    }
                } else {
                    WireResult::Ok
                }
            }
            Op::Hello { version, .. } => WireResult::Refused {
                why: format!("protocol version {version}; this daemon speaks {VERSION}"),
            },
            Op::Connect { params } => {
                let (r, watch) = self.connect(s, params).await;
                Self::reply(s, seq, r);
                if let Some((conn, slot)) = watch {
                    self.watch(s.clone(), conn, slot);
                }
                return;
            }
            Op::Listen {
                service_id,
                transports,
            } => self.listen(s, service_id, transports, None).await,
            Op::ListenStateless {
                service_id,
                transports,
                template,
            } => match template.to_template() {
                Ok(t) => self.listen(s, service_id, transports, Some(t)).await,
                Err(why) => WireResult::Refused { why },
            },
            Op::Unlisten { service_id } => {
                let mine = s.lock().listens.remove(&service_id);
                if let Some(token) = mine {
                    lock(&self.services).remove(&service_id);
                    self.cm.send(Command::Unlisten {
                        service_id: sid(service_id),
                        token,
                    });
                }
                WireResult::Ok
            }
            Op::Accept { conn, params } => {
                if !s.lock().conns.get(&conn).is_some_and(|c| c.unanswered) {
                    not_yours(conn)
                } else {
                    match params.to_params() {
                        Err(why) => WireResult::Refused { why },
                        Ok(params) => {
                            let r = self
                                .cm
                                .call(|reply| Command::Accept {
                                    conn: ibcm_mad::CommId(conn),
                                    params,
                                    reply,
                                })
                                .await;
                            match r {
                                // Watched since its REQ arrived.
                                Ok(Ok(_slot)) => {
                                    s.lock().answered(conn);
                                    WireResult::Ok
                                }
                                Ok(Err(e)) => WireResult::CallError(WireCallError::from_error(&e)),
                                Err(_) => WireResult::Refused {
                                    why: "the endpoint has stopped".into(),
                                },
                            }
                        }
                    }
                }
            }
            Op::Reject {
                conn,
                reason,
                ari,
                private_data,
            } => {
                if !Self::owns(s, conn) {
                    not_yours(conn)
                } else {
                    let r = self
                        .cm
                        .call(|reply| Command::Reject {
                            conn: ibcm_mad::CommId(conn),
                            reason: RejReason::from_raw(reason),
                            ari,
                            private_data,
                            reply,
                        })
                        .await;
                    // A rejected REQ leaves the table without a status a watcher would see.
                    let mut st = s.lock();
                    if st.conns.get(&conn).is_some_and(|c| c.unanswered) {
                        st.remove_conn(conn);
                    }
                    unit(r)
                }
            }
            Op::Establish { conn, private_data } => {
                if !Self::owns(s, conn) {
                    not_yours(conn)
                } else {
                    unit(
                        self.cm
                            .call(|reply| Command::Establish {
                                conn: ibcm_mad::CommId(conn),
                                private_data,
                                reply,
                            })
                            .await,
                    )
                }
            }
            Op::Mra {
                conn,
                service_timeout,
            } => {
                if !Self::owns(s, conn) {
                    not_yours(conn)
                } else {
                    unit(
                        self.cm
                            .call(|reply| Command::Mra {
                                conn: ibcm_mad::CommId(conn),
                                service_timeout: texp(service_timeout),
                                reply,
                            })
                            .await,
                    )
                }
            }
            Op::Disconnect { conn, private_data } => {
                if !Self::owns(s, conn) {
                    not_yours(conn)
                } else {
                    unit(
                        self.cm
                            .call(|reply| Command::Disconnect {
                                conn: ibcm_mad::CommId(conn),
                                private_data,
                                reply,
                            })
                            .await,
                    )
                }
            }
            Op::Unanswered { conn } if self.sidr_unanswered(s, conn) => WireResult::Ok,
            Op::Unanswered { conn } => {
                let mine = s.lock().conns.get(&conn).is_some_and(|c| c.unanswered);
                if mine {
                    s.lock().remove_conn(conn);
                    self.cm.send(Command::Unanswered {
                        id: ibcm_mad::CommId(conn),
                        sidr: false,
                    });
                }
                WireResult::Ok
            }
            Op::PendingDropped { conn } => {
                if Self::owns(s, conn) {
                    self.cm.send(Command::PendingDropped {
                        id: ibcm_mad::CommId(conn),
                    });
                }
                WireResult::Ok
            }
            Op::RandomPsn => match self.cm.call(|reply| Command::RandomPsn { reply }).await {
                Ok(p) => WireResult::Value {
                    value: u64::from(p.get()),
                },
                Err(_) => WireResult::Refused {
                    why: "the endpoint has stopped".into(),
                },
            },
            Op::Len => WireResult::Value {
                value: s.lock().conns.len() as u64,
            },
            Op::Sidr { req } => {
                self.sidr(s, seq, req).await;
                return;
            }
            Op::SidrReply { conn, rep } => self.sidr_reply(s, conn, &rep).await,
            Op::Stats => self.stats().await,
            Op::ResolvePath { target, alternate } => {
                self.resolve_path(s, seq, target, alternate);
                return;
            }
            Op::LoadAltPath { conn, lap } => {
                self.load_alt_path(s, seq, conn, &lap);
                return;
            }
            Op::LapPolicy { application } => self.lap_policy(s, application),
            Op::Apr { conn, apr } => self.apr(s, conn, apr).await,
            Op::PathMigrated { conn } => self.path_migrated(s, conn).await,
            Op::XrcListen {
                service_id,
                policy,
                srqns,
                domain,
                tgt_qpn,
            } => {
                let req = super::hooks::XrcListenReq {
                    policy: &policy,
                    srqns: &srqns,
                    domain: domain.as_deref(),
                    tgt_qpn,
                };
                self.xrc_listen(s, service_id, req).await
            }
            Op::Keeper { req } => {
                let sink = EventSink { out: s.out.clone() };
                match self.hooks.keeper(s.info, req, sink).await {
                    Ok(reply) => WireResult::Keeper { reply },
                    Err(why) => WireResult::Refused { why },
                }
            }
            Op::XrcDestroy => match self.hooks.xrc_destroy(s.info).await {
                Ok(value) => WireResult::Value { value },
                Err(why) => WireResult::Refused { why },
            },
            Op::XrcOrphans => match self.hooks.xrc_orphans(s.info).await {
                Ok(qps) => WireResult::XrcQps { qps },
                Err(why) => WireResult::Refused { why },
            },
            Op::XrcReclaim { qpn } => match self.hooks.xrc_reclaim(s.info, qpn).await {
                Ok(value) => WireResult::Value { value },
                Err(why) => WireResult::Refused { why },
            },
            Op::XrcUnlisten { service_id } => {
                let mine = s.lock().xrc.remove(&service_id);
                if mine {
                    lock(&self.services).remove(&service_id);
                    self.hooks.xrc_unlisten(s.info, sid(service_id)).await;
                }
                WireResult::Ok
            }
        };
        Self::reply(s, seq, r);
    }

    async fn connect(
        self: &Arc<Self>,
        s: &Arc<Session>,
        params: super::proto::WireConnect,
    ) -> (WireResult, Option<(u32, SlotRef)>) {
        if let Some(why) = self.connection_quota(s) {
            return (WireResult::Refused { why }, None);
        }
        let mut params = match params.to_params() {
            Ok(p) => p,
            Err(why) => return (WireResult::Refused { why }, None),
        };
        params.peer = match self.cfg.peer(params.peer) {
            Ok(p) => p,
            Err(why) => return (WireResult::Refused { why }, None),
        };
        let peer = params.peer;
        match self
            .cm
            .call(|reply| Command::Connect { params, reply })
            .await
        {
            Ok(Ok((id, slot, req))) => {
                let sink = {
                    let mut st = s.lock();
                    st.conns
                        .insert(id.0, ConnEntry::new(false, None, Some(peer), None));
                    st.lap_sink.clone()
                };
                // Before the REP can come back: its LAPs can come only once it is
                // established.
                self.delegate_laps(sink, id.0);
                // Watched once the reply is queued: the client knows the connection before
                // its first event.
                let req = super::wire::body(&ibcm_mad::cm::CmMessage::Req(*req));
                (WireResult::Conn { conn: id.0, req }, Some((id.0, slot)))
            }
            Ok(Err(crate::rt::CmError::Connect(e))) => (
                WireResult::ConnectError(WireConnectError::from_error(&e)),
                None,
            ),
            Ok(Err(e)) => (WireResult::Refused { why: e.to_string() }, None),
            Err(_) => (
                WireResult::Refused {
                    why: "the endpoint has stopped".into(),
                },
                None,
            ),
        }
    }

    async fn listen(
        self: &Arc<Self>,
        s: &Arc<Session>,
        service_id: u64,
        transports: Vec<u8>,
        stateless: Option<StatelessAccept>,
    ) -> WireResult {
        if let Some(r) = self.claim(s, service_id) {
            return r;
        }
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (stx, mut srx) = mpsc::unbounded_channel();
        let options = ListenOptions {
            transports: transports.into_iter().map(transport_of).collect(),
        };
        let r = match stateless {
            None => {
                drop(stx);
                self.cm
                    .call(|reply| Command::Listen {
                        service_id: sid(service_id),
                        options,
                        tx,
                        reply,
                    })
                    .await
            }
            Some(template) => {
                self.cm
                    .call(|reply| Command::ListenStateless {
                        service_id: sid(service_id),
                        options,
                        template,
                        tx,
                        stateless: stx,
                        reply,
                    })
                    .await
            }
        };
        let token = match r {
            Ok(Ok(token)) => token,
            Ok(Err(e)) => {
                lock(&self.services).remove(&service_id);
                return WireResult::Refused { why: e.to_string() };
            }
            Err(_) => {
                lock(&self.services).remove(&service_id);
                return WireResult::Refused {
                    why: "the endpoint has stopped".into(),
                };
            }
        };
        s.lock().listens.insert(service_id, token);
        let (me, s2) = (self.clone(), s.clone());
        tokio::spawn(async move {
            let mut stateless_open = true;
            loop {
                tokio::select! {
                    biased;
                    a = srx.recv(), if stateless_open => match a {
                        Some((id, info)) => me.stateless(&s2, service_id, id, &info),
                        None => stateless_open = false,
                    },
                    r = rx.recv() => match r {
                        Some((id, kind)) => me.incoming(&s2, service_id, id, kind),
                        None => return,
                    },
                }
            }
        });
        WireResult::Ok
    }

    /// A connection the endpoint established statelessly for a listener of `s`: a new
    /// connection of the session (over a quota, or for a session that is closing: a DREQ).
    fn stateless(
        self: &Arc<Self>,
        s: &Arc<Session>,
        service_id: u64,
        id: ConnId,
        info: &StatelessInfo,
    ) {
        let quota = self.connection_quota(s);
        let wire = WireStatelessInfo::from_info(info);
        let taken = {
            let mut st = s.lock();
            match (&wire, st.closed || quota.is_some()) {
                (Ok(_), false) => {
                    let remote = (info.req.req.local_comm_id.0, info.req.remote_qpn().get());
                    st.conns.insert(
                        id.0,
                        ConnEntry::new(false, Some(remote), Some(info.req.peer), Some(service_id)),
                    );
                    Some(st.lap_sink.clone())
                }
                _ => None,
            }
        };
        let taken = match taken {
            Some(sink) => {
                self.delegate_laps(sink, id.0);
                true
            }
            None => false,
        };
        let (Ok(wire), true) = (wire, taken) else {
            let (reply, _) = tokio::sync::oneshot::channel();
            self.cm.send(Command::Disconnect {
                conn: id,
                private_data: Vec::new(),
                reply,
            });
            return;
        };
        s.out.push(&DaemonMsg::Stateless {
            service_id,
            conn: id.0,
            info: wire,
        });
        if let Some(c) = self.cm.connection(id) {
            self.watch(s.clone(), id.0, c.slot);
        }
    }

    /// Takes `service_id` for `s`, or says why not.
    fn claim(&self, s: &Session, service_id: u64) -> Option<WireResult> {
        let held = self
            .cfg
            .reserved
            .iter()
            .find(|r| (r.first..=r.last).contains(&service_id) && r.uid != s.info.uid);
        if let Some(r) = held {
            return Some(WireResult::Refused {
                why: format!(
                    "service ID {} is reserved for uid {}",
                    ServiceId(service_id),
                    r.uid
                ),
            });
        }
        {
            let st = s.lock();
            if st.listens.len() + st.xrc.len() >= self.cfg.max_listeners {
                return Some(WireResult::Refused {
                    why: format!("quota: {} listeners", self.cfg.max_listeners),
                });
            }
        }
        let mut svc = lock(&self.services);
        match svc.get(&service_id) {
            Some(&other) => Some(WireResult::Refused {
                why: format!(
                    "service ID {} is listened on by {}",
                    ServiceId(service_id),
                    if other == s.info.id {
                        "this client already"
                    } else {
                        "another client"
                    }
                ),
            }),
            None => {
                svc.insert(service_id, s.info.id);
                None
            }
        }
    }

    fn incoming(
        self: &Arc<Self>,
        s: &Arc<Session>,
        service_id: u64,
        id: ConnId,
        kind: IncomingKind,
    ) {
        match kind {
            IncomingKind::Connect(req) => {
                let quota = self.connection_quota(s);
                let (over, full, sink) = {
                    let mut st = s.lock();
                    let pending = st.backlog.get(&service_id).copied().unwrap_or(0);
                    if st.closed || quota.is_some() {
                        (true, false, None)
                    } else if pending >= self.cfg.listen_backlog {
                        (true, true, None)
                    } else {
                        let remote = (req.req.local_comm_id.0, req.remote_qpn().get());
                        st.conns.insert(
                            id.0,
                            ConnEntry::new(true, Some(remote), Some(req.peer), Some(service_id)),
                        );
                        *st.backlog.entry(service_id).or_insert(0) += 1;
                        (false, false, st.lap_sink.clone())
                    }
                };
                self.delegate_laps(sink, id.0);
                if full {
                    // The listener's backlog is full: REJ 3 "no resources", as the endpoint
                    // answers a source over its half-open cap; the client hears nothing.
                    self.backlog_full(s, service_id, id);
                    return;
                }
                if over {
                    self.cm.send(Command::Unanswered { id, sidr: false });
                    return;
                }
                match WireReq::from_info(&req) {
                    Ok(req) => {
                        s.out.push(&DaemonMsg::Incoming {
                            service_id,
                            conn: id.0,
                            req,
                        });
                        // Watched from the REQ on: a peer that gives up before the answer,
                        // or a reject, ends it at the client too.
                        if let Some(c) = self.cm.connection(id) {
                            self.watch(s.clone(), id.0, c.slot);
                        }
                    }
                    Err(_) => {
                        s.lock().remove_conn(id.0);
                        self.cm.send(Command::Unanswered { id, sidr: false });
                    }
                }
            }
            IncomingKind::Sidr(info) => self.incoming_sidr(s, service_id, id, &info),
        }
    }

    /// Rejects the REQ `id` for `service_id` whose backlog is full; counted, and logged
    /// (the first of a session's listener, then every 1,024th of the daemon).
    fn backlog_full(&self, s: &Session, service_id: u64, id: ConnId) {
        let (reply, _) = tokio::sync::oneshot::channel();
        self.cm.send(Command::Reject {
            conn: id,
            reason: RejReason::NoResources,
            ari: Vec::new(),
            private_data: Vec::new(),
            reply,
        });
        let n = self
            .backlog_rejects
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .saturating_add(1);
        if n == 1 || n.is_multiple_of(1024) {
            tracing::warn!(
                session = s.info.id,
                service = %ServiceId(service_id),
                backlog = self.cfg.listen_backlog,
                rejected = n,
                "listen backlog full: REQ rejected (REJ 3 no resources)"
            );
        }
    }

    async fn xrc_listen(
        self: &Arc<Self>,
        s: &Arc<Session>,
        service_id: u64,
        req: super::hooks::XrcListenReq<'_>,
    ) -> WireResult {
        if let Some(r) = self.claim(s, service_id) {
            return r;
        }
        let sink = EventSink { out: s.out.clone() };
        match self
            .hooks
            .xrc_listen(s.info, sid(service_id), req, sink)
            .await
        {
            Ok(()) => {
                s.lock().xrc.insert(service_id);
                WireResult::Ok
            }
            Err(why) => {
                lock(&self.services).remove(&service_id);
                WireResult::Refused { why }
            }
        }
    }
}

/// A call's answer: `ok`, its `call-error`, or "the endpoint has stopped".
pub(super) fn unit<E>(r: Result<Result<(), crate::proto::CallError>, E>) -> WireResult {
    match r {
        Ok(Ok(())) => WireResult::Ok,
        Ok(Err(e)) => WireResult::CallError(WireCallError::from_error(&e)),
        Err(_) => WireResult::Refused {
            why: "the endpoint has stopped".into(),
        },
    }
}
