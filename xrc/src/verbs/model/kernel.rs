//! The simulated kernel: processes and their handles, domains keyed by path, QPs and SRQs,
//! and what each verb does to them (the rules listed in the [module docs](super)).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::PathBuf;

use super::{Delivery, ModelConfig, QpnReuse, IBV_DEVICE_XRC};
use crate::types::{DomainSpec, ProcessId, QpHandle, Qpn, SrqHandle, SrqNum, XrcdHandle};
use crate::verbs::qp::{check_modify, QpAttr, QpState, QpType};
use crate::verbs::{DeviceInfo, QpInfo, SrqAttr, VerbsError, EOPNOTSUPP};

#[derive(Debug)]
enum Obj {
    Xrcd { xrcd: u32, users: usize },
    Qp { qpn: u32, via: Option<u32> },
    Srq { srqn: u32, via: u32 },
}

#[derive(Debug, Default)]
pub(super) struct Proc {
    handles: BTreeMap<u32, Obj>,
    next_handle: u32,
}

#[derive(Debug)]
pub(super) struct Xrcd {
    path: Option<PathBuf>,
    pub(super) usecnt: usize,
    tgt_qps: BTreeSet<u32>,
}

#[derive(Debug)]
pub(super) struct RealQp {
    pub(super) qp_type: QpType,
    pub(super) state: QpState,
    dest_qpn: Option<Qpn>,
    /// The PSN the responder expects next (set by `rq_psn` at RTR).
    expected_psn: Option<u32>,
    xrcd: Option<u32>,
    handles: usize,
}

/// An XRC SRQ: its domain and the messages received into it, not yet polled (at most
/// `max_wr`: as many receives as a runtime posts).
#[derive(Debug)]
pub(super) struct Srq {
    xrcd: u32,
    max_wr: usize,
    received: VecDeque<Vec<u8>>,
}

#[derive(Debug)]
pub(super) struct Kernel {
    cfg: ModelConfig,
    pub(super) next_pid: u32,
    pub(super) procs: BTreeMap<ProcessId, Proc>,
    pub(super) xrcd_by_path: BTreeMap<PathBuf, u32>,
    pub(super) xrcds: BTreeMap<u32, Xrcd>,
    next_xrcd: u32,
    pub(super) qps: BTreeMap<u32, RealQp>,
    pub(super) srqs: BTreeMap<u32, Srq>,
    next_qpn: u32,
    freed_qpns: Vec<u32>,
    next_srqn: u32,
}

impl Kernel {
    /// A device without processes or objects.
    pub(super) fn new(cfg: ModelConfig) -> Self {
        let first_qpn = cfg.first_qpn.clamp(2, Qpn::MAX);
        let first_srqn = cfg.first_srqn.min(SrqNum::MAX);
        Self {
            next_pid: cfg.first_pid,
            cfg,
            procs: BTreeMap::new(),
            xrcd_by_path: BTreeMap::new(),
            xrcds: BTreeMap::new(),
            next_xrcd: 1,
            qps: BTreeMap::new(),
            srqs: BTreeMap::new(),
            next_qpn: first_qpn,
            freed_qpns: Vec::new(),
            next_srqn: first_srqn,
        }
    }

    pub(super) fn device(&self) -> DeviceInfo {
        DeviceInfo {
            name: self.cfg.device_name.clone(),
            xrc: self.cfg.xrc,
            open_qp: self.cfg.open_qp,
            cap_flags: if self.cfg.xrc { IBV_DEVICE_XRC } else { 0 },
        }
    }

    fn need_xrc(&self) -> Result<(), VerbsError> {
        if self.cfg.xrc {
            Ok(())
        } else {
            // rdma-core's answer on such a device (rxe: no `open_xrcd` in its ops)
            Err(VerbsError::NoXrc {
                device: self.cfg.device_name.clone(),
                cap_flags: 0,
                provider_errno: Some(EOPNOTSUPP),
            })
        }
    }

    pub(super) fn holders(&self, qpn: u32) -> Vec<ProcessId> {
        let mut out = Vec::new();
        for (pid, p) in &self.procs {
            for obj in p.handles.values() {
                if matches!(obj, Obj::Qp { qpn: q, .. } if *q == qpn) {
                    out.push(*pid);
                }
            }
        }
        out
    }

    fn proc_mut(&mut self, pid: ProcessId) -> Result<&mut Proc, VerbsError> {
        self.procs
            .get_mut(&pid)
            .ok_or(VerbsError::ProcessExited { pid })
    }

    fn proc_ref(&self, pid: ProcessId) -> Result<&Proc, VerbsError> {
        self.procs
            .get(&pid)
            .ok_or(VerbsError::ProcessExited { pid })
    }

    fn add_handle(&mut self, pid: ProcessId, obj: Obj) -> Result<u32, VerbsError> {
        let p = self.proc_mut(pid)?;
        let h = p.next_handle;
        p.next_handle = p.next_handle.wrapping_add(1);
        p.handles.insert(h, obj);
        Ok(h)
    }

    /// The XRCD behind a process's XRCD handle.
    fn xrcd_of(&self, pid: ProcessId, h: XrcdHandle) -> Result<u32, VerbsError> {
        match self.proc_ref(pid)?.handles.get(&h.0) {
            Some(Obj::Xrcd { xrcd, .. }) => Ok(*xrcd),
            _ => Err(VerbsError::BadHandle {
                what: "xrcd",
                raw: h.0,
            }),
        }
    }

    fn bump_users(&mut self, pid: ProcessId, h: u32, up: bool) {
        if let Some(Obj::Xrcd { users, .. }) =
            self.procs.get_mut(&pid).and_then(|p| p.handles.get_mut(&h))
        {
            *users = if up {
                users.saturating_add(1)
            } else {
                users.saturating_sub(1)
            };
        }
    }

    pub(super) fn qp_of(&self, pid: ProcessId, h: QpHandle) -> Result<u32, VerbsError> {
        match self.proc_ref(pid)?.handles.get(&h.0) {
            Some(Obj::Qp { qpn, .. }) => Ok(*qpn),
            _ => Err(VerbsError::BadHandle {
                what: "qp",
                raw: h.0,
            }),
        }
    }

    fn alloc_qpn(&mut self) -> Result<u32, VerbsError> {
        if self.qps.len() >= self.cfg.max_qps {
            return Err(VerbsError::NoResources { what: "QP" });
        }
        if self.cfg.qpn_reuse == QpnReuse::MostRecentFirst {
            while let Some(q) = self.freed_qpns.pop() {
                if !self.qps.contains_key(&q) {
                    return Ok(q);
                }
            }
        }
        // At most 2^24 probes; `max_qps` keeps the table far from full in practice.
        for _ in 0..=Qpn::MAX {
            let q = self.next_qpn;
            self.next_qpn = if q >= Qpn::MAX { 2 } else { q + 1 };
            if q >= 2 && !self.qps.contains_key(&q) {
                return Ok(q);
            }
        }
        Err(VerbsError::NoResources { what: "QP" })
    }

    fn alloc_srqn(&mut self) -> Result<u32, VerbsError> {
        for _ in 0..=SrqNum::MAX {
            let s = self.next_srqn;
            self.next_srqn = if s >= SrqNum::MAX { 0 } else { s + 1 };
            if !self.srqs.contains_key(&s) {
                return Ok(s);
            }
        }
        Err(VerbsError::NoResources { what: "SRQ" })
    }

    fn xrcd_unref(&mut self, id: u32) {
        let gone = match self.xrcds.get_mut(&id) {
            Some(x) => {
                x.usecnt = x.usecnt.saturating_sub(1);
                x.usecnt == 0
            }
            None => false,
        };
        if gone {
            if let Some(x) = self.xrcds.remove(&id) {
                if let Some(p) = x.path {
                    self.xrcd_by_path.remove(&p);
                }
            }
        }
    }

    pub(super) fn open_xrcd(
        &mut self,
        pid: ProcessId,
        spec: &DomainSpec,
    ) -> Result<XrcdHandle, VerbsError> {
        self.need_xrc()?;
        self.proc_ref(pid)?;
        let id = match spec {
            DomainSpec::Private => self.new_xrcd(None),
            DomainSpec::File {
                path,
                create,
                exclusive,
            } => match self.xrcd_by_path.get(path).copied() {
                Some(id) => {
                    if *create && *exclusive {
                        return Err(VerbsError::DomainExists {
                            path: path.display().to_string(),
                        });
                    }
                    if let Some(x) = self.xrcds.get_mut(&id) {
                        x.usecnt = x.usecnt.saturating_add(1);
                    }
                    id
                }
                None if *create => {
                    let id = self.new_xrcd(Some(path.clone()));
                    self.xrcd_by_path.insert(path.clone(), id);
                    id
                }
                None => {
                    return Err(VerbsError::DomainNotFound {
                        path: path.display().to_string(),
                    })
                }
            },
        };
        let h = self.add_handle(pid, Obj::Xrcd { xrcd: id, users: 0 })?;
        Ok(XrcdHandle(h))
    }

    fn new_xrcd(&mut self, path: Option<PathBuf>) -> u32 {
        let id = self.next_xrcd;
        self.next_xrcd = self.next_xrcd.wrapping_add(1);
        self.xrcds.insert(
            id,
            Xrcd {
                path,
                usecnt: 1,
                tgt_qps: BTreeSet::new(),
            },
        );
        id
    }

    pub(super) fn close_xrcd(&mut self, pid: ProcessId, h: XrcdHandle) -> Result<(), VerbsError> {
        let p = self.proc_mut(pid)?;
        let (id, users) = match p.handles.get(&h.0) {
            Some(Obj::Xrcd { xrcd, users }) => (*xrcd, *users),
            _ => {
                return Err(VerbsError::BadHandle {
                    what: "xrcd",
                    raw: h.0,
                })
            }
        };
        if users > 0 {
            return Err(VerbsError::Busy {
                what: "XRCD",
                users,
            });
        }
        p.handles.remove(&h.0);
        self.xrcd_unref(id);
        Ok(())
    }

    pub(super) fn create_tgt_qp(
        &mut self,
        pid: ProcessId,
        h: XrcdHandle,
    ) -> Result<QpHandle, VerbsError> {
        self.need_xrc()?;
        let id = self.xrcd_of(pid, h)?;
        let qpn = self.alloc_qpn()?;
        self.qps.insert(
            qpn,
            RealQp {
                qp_type: QpType::XrcTgt,
                state: QpState::Reset,
                dest_qpn: None,
                expected_psn: None,
                xrcd: Some(id),
                handles: 1,
            },
        );
        if let Some(x) = self.xrcds.get_mut(&id) {
            x.usecnt = x.usecnt.saturating_add(1);
            x.tgt_qps.insert(qpn);
        }
        self.bump_users(pid, h.0, true);
        let qh = self.add_handle(
            pid,
            Obj::Qp {
                qpn,
                via: Some(h.0),
            },
        )?;
        Ok(QpHandle(qh))
    }

    pub(super) fn open_tgt_qp(
        &mut self,
        pid: ProcessId,
        h: XrcdHandle,
        qpn: Qpn,
    ) -> Result<QpHandle, VerbsError> {
        self.need_xrc()?;
        if !self.cfg.open_qp {
            return Err(VerbsError::NotSupported {
                op: "ibv_open_qp",
                device: self.cfg.device_name.clone(),
                errno: EOPNOTSUPP,
            });
        }
        let id = self.xrcd_of(pid, h)?;
        let known = self
            .xrcds
            .get(&id)
            .is_some_and(|x| x.tgt_qps.contains(&qpn.get()));
        if !known {
            return Err(VerbsError::UnknownQpn { qpn });
        }
        if let Some(q) = self.qps.get_mut(&qpn.get()) {
            q.handles = q.handles.saturating_add(1);
        }
        self.bump_users(pid, h.0, true);
        let qh = self.add_handle(
            pid,
            Obj::Qp {
                qpn: qpn.get(),
                via: Some(h.0),
            },
        )?;
        Ok(QpHandle(qh))
    }

    pub(super) fn create_ini_qp(&mut self, pid: ProcessId) -> Result<QpHandle, VerbsError> {
        self.need_xrc()?;
        self.proc_ref(pid)?;
        let qpn = self.alloc_qpn()?;
        self.qps.insert(
            qpn,
            RealQp {
                qp_type: QpType::XrcIni,
                state: QpState::Reset,
                dest_qpn: None,
                expected_psn: None,
                xrcd: None,
                handles: 1,
            },
        );
        let qh = self.add_handle(pid, Obj::Qp { qpn, via: None })?;
        Ok(QpHandle(qh))
    }

    pub(super) fn create_srq(
        &mut self,
        pid: ProcessId,
        h: XrcdHandle,
        attr: &SrqAttr,
    ) -> Result<SrqHandle, VerbsError> {
        self.need_xrc()?;
        let id = self.xrcd_of(pid, h)?;
        let srqn = self.alloc_srqn()?;
        self.srqs.insert(
            srqn,
            Srq {
                xrcd: id,
                max_wr: usize::try_from(attr.max_wr.max(1)).unwrap_or(usize::MAX),
                received: VecDeque::new(),
            },
        );
        if let Some(x) = self.xrcds.get_mut(&id) {
            x.usecnt = x.usecnt.saturating_add(1);
        }
        self.bump_users(pid, h.0, true);
        let sh = self.add_handle(pid, Obj::Srq { srqn, via: h.0 })?;
        Ok(SrqHandle(sh))
    }

    pub(super) fn srq_num(&self, pid: ProcessId, h: SrqHandle) -> Result<SrqNum, VerbsError> {
        match self.proc_ref(pid)?.handles.get(&h.0) {
            Some(Obj::Srq { srqn, .. }) => SrqNum::new(*srqn).ok_or(VerbsError::BadHandle {
                what: "srq",
                raw: h.0,
            }),
            _ => Err(VerbsError::BadHandle {
                what: "srq",
                raw: h.0,
            }),
        }
    }

    pub(super) fn destroy_srq(&mut self, pid: ProcessId, h: SrqHandle) -> Result<(), VerbsError> {
        let p = self.proc_mut(pid)?;
        let (srqn, via) = match p.handles.get(&h.0) {
            Some(Obj::Srq { srqn, via }) => (*srqn, *via),
            _ => {
                return Err(VerbsError::BadHandle {
                    what: "srq",
                    raw: h.0,
                })
            }
        };
        p.handles.remove(&h.0);
        self.bump_users(pid, via, false);
        if let Some(srq) = self.srqs.remove(&srqn) {
            self.xrcd_unref(srq.xrcd);
        }
        Ok(())
    }

    /// A SEND that arrived for TGT QP `qpn`, its XRCETH naming `srqn`: received into the
    /// SRQ when the responder's checks pass (docs/xrc.md §1.2: a TGT QP delivers into any
    /// SRQ of its own domain, and only those).
    pub(super) fn deliver(&mut self, qpn: u32, psn: u32, srqn: u32, payload: &[u8]) -> Delivery {
        let Some(qp) = self.qps.get_mut(&qpn) else {
            return Delivery::UnknownQp;
        };
        if qp.qp_type != QpType::XrcTgt {
            return Delivery::NotTgt;
        }
        if !matches!(qp.state, QpState::Rtr | QpState::Rts) {
            return Delivery::NotReady(qp.state);
        }
        let expected = qp.expected_psn.unwrap_or(0);
        if psn != expected {
            return Delivery::OutOfSequence { expected };
        }
        let Some(srq) = self.srqs.get_mut(&srqn) else {
            return Delivery::UnknownSrq;
        };
        if qp.xrcd != Some(srq.xrcd) {
            return Delivery::OtherDomain;
        }
        if srq.received.len() >= srq.max_wr {
            return Delivery::ReceiverNotReady;
        }
        srq.received.push_back(payload.to_vec());
        qp.expected_psn = Some(expected.wrapping_add(1) & 0x00ff_ffff);
        Delivery::Received
    }

    /// The oldest message received into this process's SRQ `h`, if any.
    pub(super) fn poll_srq(
        &mut self,
        pid: ProcessId,
        h: SrqHandle,
    ) -> Result<Option<Vec<u8>>, VerbsError> {
        let srqn = self.srq_num(pid, h)?.get();
        Ok(self
            .srqs
            .get_mut(&srqn)
            .and_then(|srq| srq.received.pop_front()))
    }

    pub(super) fn destroy_qp(&mut self, pid: ProcessId, h: QpHandle) -> Result<(), VerbsError> {
        let p = self.proc_mut(pid)?;
        let (qpn, via) = match p.handles.get(&h.0) {
            Some(Obj::Qp { qpn, via }) => (*qpn, *via),
            _ => {
                return Err(VerbsError::BadHandle {
                    what: "qp",
                    raw: h.0,
                })
            }
        };
        p.handles.remove(&h.0);
        if let Some(v) = via {
            self.bump_users(pid, v, false);
        }
        let last = match self.qps.get_mut(&qpn) {
            Some(q) => {
                q.handles = q.handles.saturating_sub(1);
                q.handles == 0
            }
            None => false,
        };
        if last {
            if let Some(q) = self.qps.remove(&qpn) {
                if let Some(id) = q.xrcd {
                    if let Some(x) = self.xrcds.get_mut(&id) {
                        x.tgt_qps.remove(&qpn);
                    }
                    self.xrcd_unref(id);
                }
            }
            self.freed_qpns.push(qpn);
        }
        Ok(())
    }

    pub(super) fn modify_qp(
        &mut self,
        pid: ProcessId,
        h: QpHandle,
        attr: &QpAttr,
    ) -> Result<(), VerbsError> {
        let qpn = self.qp_of(pid, h)?;
        let q = self.qps.get_mut(&qpn).ok_or(VerbsError::BadHandle {
            what: "qp",
            raw: h.0,
        })?;
        let next = check_modify(q.qp_type, q.state, attr)?;
        q.state = next;
        if let Some(d) = attr.dest_qpn {
            q.dest_qpn = Some(d);
        }
        if let Some(p) = attr.rq_psn {
            q.expected_psn = Some(p.get());
        }
        if next == QpState::Reset {
            q.dest_qpn = None;
            q.expected_psn = None;
        }
        Ok(())
    }

    pub(super) fn query_qp(&self, pid: ProcessId, h: QpHandle) -> Result<QpInfo, VerbsError> {
        let qpn = self.qp_of(pid, h)?;
        let q = self.qps.get(&qpn).ok_or(VerbsError::BadHandle {
            what: "qp",
            raw: h.0,
        })?;
        Ok(QpInfo {
            qpn: Qpn::masked(qpn),
            qp_type: q.qp_type,
            state: q.state,
            dest_qpn: q.dest_qpn,
        })
    }

    pub(super) fn exit(&mut self, pid: ProcessId) -> bool {
        let Some(p) = self.procs.get(&pid) else {
            return false;
        };
        let mut qps = Vec::new();
        let mut srqs = Vec::new();
        let mut xrcds = Vec::new();
        for (h, obj) in &p.handles {
            match obj {
                Obj::Qp { .. } => qps.push(*h),
                Obj::Srq { .. } => srqs.push(*h),
                Obj::Xrcd { .. } => xrcds.push(*h),
            }
        }
        // Same order as uverbs cleanup: QPs, then SRQs, then XRCDs. None of these can fail
        // for a handle that exists.
        for h in qps {
            let _ = self.destroy_qp(pid, QpHandle(h));
        }
        for h in srqs {
            let _ = self.destroy_srq(pid, SrqHandle(h));
        }
        for h in xrcds {
            let _ = self.close_xrcd(pid, XrcdHandle(h));
        }
        self.procs.remove(&pid);
        true
    }
}
