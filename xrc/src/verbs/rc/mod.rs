//! RC QPs with data over rdma-core (features `rdma` and `cm`): the verbs path a CM connection
//! needs to become a working QP.
//!
//! * [`Device`]: an opened RDMA device and one protection domain ([`Device::open`] by name,
//!   [`Device::port`], [`Device::gid`], [`Device::limits`]);
//! * [`CompletionQueue`]: a CQ with its own completion channel, whose non-blocking fd
//!   ([`CompletionQueue::fd`]) an event loop waits on ([`CqEvents`] on tokio);
//!   [`CompletionQueue::poll`] drains it;
//! * [`MemoryRegion`]: a registered, zeroed, page-aligned buffer; its contents are copied in
//!   and out ([`MemoryRegion::write`], [`MemoryRegion::read`]) so no Rust reference aliases
//!   memory the device writes;
//! * [`RcQp`]: an RC QP. [`RcQp::modify`] takes what [`ibcm::qp_attr::qp_attr`] computes for
//!   INIT, RTR and RTS (attributes and mask, bit for bit `ibv_modify_qp`'s) — on RoCE its
//!   address vector is global (`is_global`, the GID index of [`LocalPort::sgid_index`]);
//!   [`RcQp::post_send`] ([`SendOp`]: SEND, RDMA WRITE, RDMA READ) and
//!   [`RcQp::post_recv`].
//!
//! Every object is released in `Drop`, in dependency order: a QP keeps its CQ, the device and
//! every memory region it had work posted on alive until it is destroyed, so no completion
//! ever lands in freed memory.
//!
//! [`LocalPort::sgid_index`]: ibcm::qp_attr::LocalPort::sgid_index
//!
//! ```no_run
//! use ibcm_xrc::verbs::rc::{Access, CompletionQueue, Device, MemoryRegion, QpCaps, RcQp};
//! let dev = Device::open("rxe0")?;
//! let cq = CompletionQueue::new(&dev, 64)?;
//! let mr = MemoryRegion::new(&dev, 4096, Access::LOCAL_WRITE | Access::REMOTE_READ)?;
//! let qp = RcQp::new(&dev, &cq, QpCaps::default())?;
//! qp.post_recv(1, &mr, 0, 64)?;
//! println!("QPN {:#x}, rkey {:#x}", qp.qpn().get(), mr.rkey());
//! # Ok::<(), ibcm_xrc::VerbsError>(())
//! ```

#[allow(unsafe_code)]
mod sys;

use std::sync::{Arc, Mutex};

use ibcm::qp_attr::{AhAttr, LinkLayer, QpAttr, QpAttrMask};
use ibcm_mad::Qpn;

use crate::verbs::ffi::{ShimAv, ShimQpAttr};
use crate::verbs::VerbsError;

/// Device limits that matter to a connection (`ibv_query_device`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceLimits {
    /// `max_qp_rd_atom`: RDMA reads this device answers per QP (caps responder resources).
    pub max_qp_rd_atom: u8,
    /// `max_qp_init_rd_atom`: RDMA reads outstanding per QP (caps initiator depth).
    pub max_qp_init_rd_atom: u8,
    /// `max_qp_wr`.
    pub max_qp_wr: u32,
    /// `max_cqe`.
    pub max_cqe: u32,
    /// `max_mr_size`.
    pub max_mr_size: u64,
    /// Number of ports.
    pub ports: u8,
}

/// What [`Device::port`] reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortInfo {
    /// `enum ibv_port_state` (4 = ACTIVE).
    pub state: u32,
    /// Active MTU (`enum ibv_mtu`: 1 = 256 … 5 = 4096).
    pub active_mtu: u32,
    /// Link layer.
    pub link_layer: LinkLayer,
    /// GID table length.
    pub gid_table_len: u32,
}

/// An opened RDMA device with one protection domain. Cheap to clone (shared).
#[derive(Clone, Debug)]
pub struct Device {
    raw: Arc<sys::DevRaw>,
    name: String,
    limits: DeviceLimits,
}

impl Device {
    /// Opens the device called `name` (`rxe0`, `mlx5_0`) and allocates a PD.
    ///
    /// # Errors
    /// [`VerbsError::NoDevice`], [`VerbsError::DeviceNotFound`], [`VerbsError::Os`].
    pub fn open(name: &str) -> Result<Self, VerbsError> {
        let (raw, a) = sys::DevRaw::open(name)?;
        Ok(Device {
            raw: Arc::new(raw),
            name: name.to_owned(),
            limits: DeviceLimits {
                max_qp_rd_atom: a.max_qp_rd_atom,
                max_qp_init_rd_atom: a.max_qp_init_rd_atom,
                max_qp_wr: a.max_qp_wr,
                max_cqe: a.max_cqe,
                max_mr_size: a.max_mr_size,
                ports: a.phys_port_cnt,
            },
        })
    }

    /// The device name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The device limits read when it was opened.
    pub fn limits(&self) -> DeviceLimits {
        self.limits
    }

    /// `ibv_query_port`.
    ///
    /// # Errors
    /// [`VerbsError::Os`] (say, no such port).
    pub fn port(&self, port: u8) -> Result<PortInfo, VerbsError> {
        let a = self.raw.query_port(port)?;
        Ok(PortInfo {
            state: a.state,
            active_mtu: a.active_mtu,
            // IBV_LINK_LAYER_ETHERNET = 2; UNSPECIFIED (0) and INFINIBAND (1) are IB.
            link_layer: if a.link_layer == 2 {
                LinkLayer::Ethernet
            } else {
                LinkLayer::InfiniBand
            },
            gid_table_len: a.gid_tbl_len,
        })
    }

    /// `ibv_query_gid`: the GID at `index` of `port`'s table.
    ///
    /// # Errors
    /// [`VerbsError::Os`].
    pub fn gid(&self, port: u8, index: u8) -> Result<[u8; 16], VerbsError> {
        self.raw.query_gid(port, index)
    }
}

/// One work completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The work request's ID.
    pub wr_id: u64,
    /// `enum ibv_wc_status` (0 = success, 5 = flushed, …).
    pub status: u32,
    /// What completed; `None` for an unsuccessful completion (its opcode is undefined).
    pub op: Option<CompletionOp>,
    /// Bytes received (receive completions) or transferred.
    pub byte_len: u32,
    /// Vendor error code.
    pub vendor_err: u32,
}

impl Completion {
    /// Whether it completed successfully.
    pub fn ok(&self) -> bool {
        self.status == 0
    }
}

/// The kind of a successful completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompletionOp {
    /// A SEND.
    Send,
    /// An RDMA WRITE.
    RdmaWrite,
    /// An RDMA READ.
    RdmaRead,
    /// A receive.
    Recv,
    /// Anything else (atomics, binds, …).
    Other,
}

/// A completion queue with its own completion channel (armed when created).
#[derive(Clone, Debug)]
pub struct CompletionQueue {
    raw: Arc<sys::CqRaw>,
    _dev: Device,
}

impl CompletionQueue {
    /// A CQ for at least `cqe` completions.
    ///
    /// # Errors
    /// [`VerbsError`].
    pub fn new(dev: &Device, cqe: u32) -> Result<Self, VerbsError> {
        Ok(CompletionQueue {
            raw: Arc::new(sys::CqRaw::create(&dev.raw, cqe)?),
            _dev: dev.clone(),
        })
    }

    /// The completion channel's fd (non-blocking): readable when the armed CQ got a
    /// completion. Valid as long as this CQ lives.
    pub fn fd(&self) -> std::os::fd::RawFd {
        self.raw.fd()
    }

    /// Re-arms the notification (`ibv_req_notify_cq`, any completion).
    ///
    /// # Errors
    /// [`VerbsError::Os`].
    pub fn arm(&self) -> Result<(), VerbsError> {
        self.raw.arm()
    }

    /// Takes and acknowledges the pending completion events; returns how many there were.
    /// The usual loop on a readable fd: `take_events`, `arm`, then `poll` until empty.
    ///
    /// # Errors
    /// [`VerbsError::Os`].
    pub fn take_events(&self) -> Result<usize, VerbsError> {
        let mut n = 0;
        while self.raw.take_event()? {
            n += 1;
        }
        Ok(n)
    }

    /// Polls up to 16 completions into `out` (appended); returns how many.
    ///
    /// # Errors
    /// [`VerbsError::Os`].
    pub fn poll(&self, out: &mut Vec<Completion>) -> Result<usize, VerbsError> {
        let mut wc = [sys::Wc::default(); 16];
        let n = self.raw.poll(&mut wc)?;
        out.extend(wc.iter().take(n).map(|w| Completion {
            wr_id: w.wr_id,
            status: w.status,
            op: (w.status == 0).then_some(match w.opcode {
                0 => CompletionOp::Send,
                1 => CompletionOp::RdmaWrite,
                2 => CompletionOp::RdmaRead,
                3 => CompletionOp::Recv,
                _ => CompletionOp::Other,
            }),
            byte_len: w.byte_len,
            vendor_err: w.vendor_err,
        }));
        Ok(n)
    }
}

/// Completion events of a [`CompletionQueue`] awaited on the tokio runtime: its channel fd
/// registered with the reactor.
#[derive(Debug)]
pub struct CqEvents {
    waiter: sys::ChannelWaiter,
    cq: CompletionQueue,
}

impl CqEvents {
    /// Registers `cq`'s completion channel with the current tokio runtime.
    ///
    /// # Errors
    /// The reactor's error (no runtime, say).
    pub fn new(cq: &CompletionQueue) -> std::io::Result<Self> {
        Ok(CqEvents {
            waiter: sys::ChannelWaiter::new(cq.raw.clone())?,
            cq: cq.clone(),
        })
    }

    /// Waits for the next completion event: then takes every pending event and re-arms the
    /// CQ, so a completion that arrives from here on raises a new one. Poll the CQ after
    /// this (and before waiting again) to drain it.
    ///
    /// # Errors
    /// [`VerbsError::Os`].
    pub async fn wait(&self) -> Result<usize, VerbsError> {
        self.waiter
            .readable()
            .await
            .map_err(|e| sys::os("epoll", e.raw_os_error().unwrap_or(5)))?;
        let n = self.cq.take_events()?;
        self.cq.arm()?;
        Ok(n)
    }
}

/// Memory-region access rights (`enum ibv_access_flags`, same bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Access(u32);

impl Access {
    /// `IBV_ACCESS_LOCAL_WRITE`: receives and RDMA READ responses land here.
    pub const LOCAL_WRITE: Access = Access(1);
    /// `IBV_ACCESS_REMOTE_WRITE`.
    pub const REMOTE_WRITE: Access = Access(1 << 1);
    /// `IBV_ACCESS_REMOTE_READ`.
    pub const REMOTE_READ: Access = Access(1 << 2);

    /// The raw bits.
    pub const fn bits(self) -> u32 {
        self.0
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

/// A registered buffer (allocated zeroed and page-aligned by the shim).
#[derive(Clone, Debug)]
pub struct MemoryRegion {
    raw: Arc<sys::MrRaw>,
    _dev: Device,
}

impl MemoryRegion {
    /// Allocates and registers `len` bytes.
    ///
    /// # Errors
    /// [`VerbsError`] (`len` 0 is EINVAL).
    pub fn new(dev: &Device, len: usize, access: Access) -> Result<Self, VerbsError> {
        Ok(MemoryRegion {
            raw: Arc::new(sys::MrRaw::register(&dev.raw, len, access.bits())?),
            _dev: dev.clone(),
        })
    }

    /// Its address (what a peer names in an RDMA READ/WRITE).
    pub fn addr(&self) -> u64 {
        self.raw.addr
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.raw.len
    }

    /// Whether it is empty (never: registration refuses 0 bytes).
    pub fn is_empty(&self) -> bool {
        self.raw.len == 0
    }

    /// The local key.
    pub fn lkey(&self) -> u32 {
        self.raw.lkey
    }

    /// The remote key a peer needs for RDMA on it.
    pub fn rkey(&self) -> u32 {
        self.raw.rkey
    }

    /// Copies `src` into the buffer at `off`.
    ///
    /// # Errors
    /// [`VerbsError::Os`] (EINVAL) when the range does not fit.
    pub fn write(&self, off: usize, src: &[u8]) -> Result<(), VerbsError> {
        self.raw.write(off, src)
    }

    /// Copies the buffer at `off` into `dst`.
    ///
    /// # Errors
    /// [`VerbsError::Os`] (EINVAL) when the range does not fit.
    pub fn read(&self, off: usize, dst: &mut [u8]) -> Result<(), VerbsError> {
        self.raw.read(off, dst)
    }
}

/// Queue sizes of an RC QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCaps {
    /// `max_send_wr`.
    pub max_send_wr: u32,
    /// `max_recv_wr`.
    pub max_recv_wr: u32,
    /// `max_inline_data`.
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_inline_data: 0,
        }
    }
}

/// What a send work request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOp {
    /// A SEND (consumes a receive at the peer).
    Send,
    /// RDMA WRITE to the peer's `remote_addr` with `rkey`.
    RdmaWrite {
        /// The peer's address.
        remote_addr: u64,
        /// The peer's rkey.
        rkey: u32,
    },
    /// RDMA READ from the peer's `remote_addr` with `rkey` (needs initiator depth ≥ 1 on
    /// this QP and responder resources ≥ 1 on the peer's).
    RdmaRead {
        /// The peer's address.
        remote_addr: u64,
        /// The peer's rkey.
        rkey: u32,
    },
}

/// A state of an RC QP as `ibv_query_qp` reports it.
pub type RawQpState = u32;

/// An RC QP on one CQ (send and receive).
#[derive(Debug)]
pub struct RcQp {
    // Field order is drop order: the QP goes first, then what it used.
    raw: sys::QpRaw,
    held: Mutex<Vec<Arc<sys::MrRaw>>>,
    _cq: CompletionQueue,
    _dev: Device,
}

impl RcQp {
    /// Creates an RC QP (state RESET) whose send and receive completions go to `cq`.
    ///
    /// # Errors
    /// [`VerbsError`].
    pub fn new(dev: &Device, cq: &CompletionQueue, caps: QpCaps) -> Result<Self, VerbsError> {
        let raw = sys::QpRaw::create(
            &dev.raw,
            &cq.raw,
            caps.max_send_wr,
            caps.max_recv_wr,
            caps.max_inline_data,
        )?;
        Ok(RcQp {
            raw,
            held: Mutex::new(Vec::new()),
            _cq: cq.clone(),
            _dev: dev.clone(),
        })
    }

    /// Its QP number (the REQ's or REP's Local QPN).
    pub fn qpn(&self) -> Qpn {
        Qpn::masked(self.raw.qpn)
    }

    /// `ibv_modify_qp` with the attributes and mask [`ibcm::qp_attr::qp_attr`] computed.
    ///
    /// # Errors
    /// [`VerbsError::Os`]: the provider refused the transition (EINVAL for a bad mask, say).
    pub fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<(), VerbsError> {
        self.raw.modify(&shim_attr(attr), mask.bits())
    }

    /// Moves the QP to ERROR: outstanding work requests complete as flushed.
    ///
    /// # Errors
    /// [`VerbsError::Os`].
    pub fn to_error(&self) -> Result<(), VerbsError> {
        self.raw.to_error()
    }

    /// The current state (`enum ibv_qp_state`: 0 RESET, 1 INIT, 2 RTR, 3 RTS, 6 ERR).
    ///
    /// # Errors
    /// [`VerbsError::Os`].
    pub fn state(&self) -> Result<RawQpState, VerbsError> {
        self.raw.state()
    }

    fn hold(&self, mr: &MemoryRegion) {
        if let Ok(mut h) = self.held.lock() {
            if !h.iter().any(|m| Arc::ptr_eq(m, &mr.raw)) {
                h.push(mr.raw.clone());
            }
        }
    }

    /// Posts a signaled send work request on `len` bytes of `mr` from `off`.
    ///
    /// # Errors
    /// [`VerbsError::Os`]: EINVAL when the range does not fit the region, ENOMEM when the
    /// send queue is full, or the provider's refusal.
    pub fn post_send(
        &self,
        wr_id: u64,
        op: SendOp,
        mr: &MemoryRegion,
        off: usize,
        len: u32,
    ) -> Result<(), VerbsError> {
        self.hold(mr);
        let (code, raddr, rkey) = match op {
            SendOp::Send => (0, 0, 0),
            SendOp::RdmaWrite { remote_addr, rkey } => (1, remote_addr, rkey),
            SendOp::RdmaRead { remote_addr, rkey } => (2, remote_addr, rkey),
        };
        self.raw
            .post_send(wr_id, code, &mr.raw, off, len, raddr, rkey, true)
    }

    /// Posts a receive of up to `len` bytes into `mr` at `off`.
    ///
    /// # Errors
    /// As [`RcQp::post_send`].
    pub fn post_recv(
        &self,
        wr_id: u64,
        mr: &MemoryRegion,
        off: usize,
        len: u32,
    ) -> Result<(), VerbsError> {
        self.hold(mr);
        self.raw.post_recv(wr_id, &mr.raw, off, len)
    }
}

fn shim_av(ah: &AhAttr) -> ShimAv {
    let mut s = ShimAv {
        dlid: ah.dlid.0,
        sl: ah.sl,
        src_path_bits: ah.src_path_bits,
        static_rate: ah.static_rate,
        port_num: ah.port_num,
        ..ShimAv::default()
    };
    if let Some(g) = &ah.grh {
        s.is_global = 1;
        s.dgid = g.dgid.0;
        s.flow_label = g.flow_label.get();
        s.sgid_index = g.sgid_index;
        s.hop_limit = g.hop_limit;
        s.traffic_class = g.traffic_class;
    }
    s
}

/// `ibcm::qp_attr::QpAttr` as the shim's `struct ibcm_xrc_qp_attr` (which the shim copies
/// into a `struct ibv_qp_attr`). Every field is copied; the mask says which ones count.
fn shim_attr(a: &QpAttr) -> ShimQpAttr {
    ShimQpAttr {
        qp_state: a.qp_state.ibv(),
        cur_qp_state: 0,
        path_mtu: u32::from(a.path_mtu.raw()),
        path_mig_state: a.path_mig_state.ibv(),
        qkey: 0,
        rq_psn: a.rq_psn.get(),
        sq_psn: a.sq_psn.get(),
        dest_qp_num: a.dest_qp_num.get(),
        qp_access_flags: a.qp_access_flags.bits(),
        pkey_index: a.pkey_index,
        alt_pkey_index: a.alt_pkey_index,
        en_sqd_async_notify: 0,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        alt_port_num: a.alt_port_num,
        alt_timeout: a.alt_timeout,
        av: shim_av(&a.ah_attr),
        alt_av: shim_av(&a.alt_ah_attr),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ibcm::mad::{Psn, Rep, Req};
    use ibcm::proto::roce_path;
    use ibcm::qp_attr::{qp_attr, Connection, LocalPort, QpState, Side};
    use ibcm_mad::{Gid, TimeoutExp};

    /// The RoCE RTR attributes reach the shim struct with a global address vector, the GID
    /// index of the local port and the negotiated values, and the RTS ones with the PSN.
    #[test]
    fn qp_attr_maps_onto_the_shim_struct() {
        let local: std::net::IpAddr = "10.77.0.2".parse().unwrap();
        let remote: std::net::IpAddr = "10.77.0.1".parse().unwrap();
        let mut req = Req {
            local_qpn: Qpn::masked(0x11),
            starting_psn: Psn::masked(0xabcdef),
            initiator_depth: 1,
            responder_resources: 1,
            primary_path: roce_path(
                Gid::from_ip(local),
                Gid::from_ip(remote),
                TimeoutExp::masked(19),
            ),
            ..Req::default()
        };
        req.set_transport(ibcm_mad::ReqTransport::Rc);
        let rep = Rep {
            local_qpn: Qpn::masked(0x22),
            starting_psn: Psn::masked(0x123456),
            responder_resources: 1,
            initiator_depth: 1,
            ..Rep::default()
        };
        let port = LocalPort {
            sgid_index: 1,
            ..LocalPort::default()
        };
        let conn = Connection::new(&req, &rep, Side::Active, LinkLayer::Ethernet, port);
        let (a, mask) = qp_attr(&conn, QpState::Rtr).unwrap();
        let s = shim_attr(&a);
        assert!(mask.contains(QpAttrMask::AV | QpAttrMask::DEST_QPN));
        assert_eq!((s.qp_state, s.dest_qp_num, s.rq_psn), (2, 0x22, 0xabcdef));
        assert_eq!((s.av.is_global, s.av.sgid_index), (1, 1));
        assert_eq!(s.av.dgid, Gid::from_ip(remote).0);
        assert_eq!((s.av.dlid, s.path_mtu), (0, u32::from(req.path_mtu.raw())));
        assert_eq!(s.max_dest_rd_atomic, 1);
        let (a, _) = qp_attr(&conn, QpState::Rts).unwrap();
        let s = shim_attr(&a);
        assert_eq!((s.qp_state, s.sq_psn, s.max_rd_atomic), (3, 0x123456, 1));
    }

    #[test]
    fn open_gives_a_typed_error_or_a_device() {
        // No RDMA device on a CI host; an rxe device in the lab.
        match Device::open("no-such-device-xyz") {
            Err(VerbsError::NoDevice | VerbsError::DeviceNotFound { .. }) => {}
            Err(e) => panic!("unexpected error {e}"),
            Ok(d) => panic!("opened {}", d.name()),
        }
    }
}
