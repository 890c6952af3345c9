//! The C types of `ibcm.h`, named as in C. Values coming from C are plain integers (an
//! out-of-range value in a Rust enum would be undefined behaviour); the enums name them.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_void};

/// The result of every call: `IBCM_OK` (0) or a negative error code. `ibcm_strerror` names
/// each; `ibcm_last_error` gives the calling thread's last failure in words.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ibcm_status {
    /// Success.
    IBCM_OK = 0,
    /// No event is queued (ibcm_get_event), or none came in time (ibcm_wait_event).
    IBCM_EAGAIN = -1,
    /// A null pointer, a malformed address, an out-of-range value.
    IBCM_EINVAL = -2,
    /// No such connection handle or listener (never existed, or its final event was
    /// acknowledged).
    IBCM_ENOENT = -3,
    /// Another call on the same connection is in progress (ibcm_disconnect is never refused
    /// so: it is queued).
    IBCM_EBUSY = -4,
    /// The call does not fit the connection's state (say, ibcm_accept on an active
    /// connection, ibcm_establish before the REP).
    IBCM_ESTATE = -5,
    /// Private data or reject information longer than the message carries.
    IBCM_ETOOLONG = -6,
    /// The QP number is used by a live connection or quarantined in TimeWait.
    IBCM_EQPN = -7,
    /// The node service refused: another client listens there, a quota, an unknown policy…
    IBCM_EREFUSED = -8,
    /// ibcm_open: the daemon's socket cannot be reached, it runs as another user (not root),
    /// or it speaks another protocol version.
    IBCM_EATTACH = -9,
    /// The connection to the node service is gone (the daemon stopped or was killed), or the
    /// context is a parent process's, inherited through fork().
    IBCM_EGONE = -10,
    /// The connection has ended: while the call waited, or before it (its final event is
    /// queued or being handled; the reason is in ibcm_last_error and in that event).
    IBCM_ECLOSED = -11,
    /// Not supported: by the node service, or by its device (an XRC call on a device without
    /// XRC: the keeper's `no-xrc` reason in ibcm_last_error).
    IBCM_EUNSUPPORTED = -12,
    /// An operating-system call failed (the event fd, the library's thread).
    IBCM_EIO = -13,
    /// A bug in libibcm (a Rust panic was caught at the boundary).
    IBCM_EINTERNAL = -14,
    /// No path to a `lid:N` / `gid:G` peer: the SA has none (or answered an error), did not
    /// answer, the daemon's port has no SM yet, or the path is not in the port's P_Key 0
    /// (the `CONNECT_ERROR` event's `reason` says which).
    IBCM_ENOPATH = -15,
    /// No answer in time: a LAP the peer never answered (`IBCM_EVENT_LAP_ERROR`).
    IBCM_ETIMEDOUT = -16,
}

/// What an event reports (`struct ibcm_event.event`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ibcm_event_type {
    /// Passive side: a REQ reached one of this context's listeners. `conn` is a new handle;
    /// answer it with ibcm_accept or ibcm_reject.
    IBCM_EVENT_CONNECT_REQUEST = 1,
    /// Active side, `IBCM_CONNECT_MANUAL_RTU`: the REP arrived (`remote_qpn`, `remote_psn`).
    /// Move the QP to RTR and RTS (ibcm_init_qp_attr), then ibcm_establish (or ibcm_reject).
    IBCM_EVENT_CONNECT_RESPONSE = 2,
    /// The connection is established: active side, the RTU went out (`private_data`: the
    /// REP's); passive side, the RTU arrived (move the QP to RTS now).
    IBCM_EVENT_ESTABLISHED = 3,
    /// Final: the peer rejected the connection (`rej_reason`, `private_data`; for XRC
    /// `target_gone` and `reason` say why in words).
    IBCM_EVENT_REJECTED = 4,
    /// Final: the peer never answered (the connect timeout or the REQ retries ran out).
    IBCM_EVENT_UNREACHABLE = 5,
    /// Final: the connection failed during setup otherwise (rejected by this side, stale,
    /// cancelled with ibcm_disconnect, the node service lost); `reason` says which.
    IBCM_EVENT_CONNECT_ERROR = 6,
    /// Final: an established connection ended (`by_peer`; the DREQ's `private_data`; for an
    /// XRC INI whose TGT QP went away, `target_gone` = 1 and `reason` e.g.
    /// "target gone (creator exited)").
    IBCM_EVENT_DISCONNECTED = 7,
    /// A report of the daemon about one of this context's XRC target services
    /// (`xrc_report`; the line in `reason`, naming the daemon's connection and TGT QP).
    /// `conn` is 0.
    IBCM_EVENT_XRC_REPORT = 8,
    /// The node service connection is gone: every connection of this context has ended
    /// (each final event is queued before this one, the context's last), and every further
    /// call on the context fails with `IBCM_EGONE` at once (ibcm_wait_event too, a blocked
    /// one included; the fd stays readable), except ibcm_ack_event, ibcm_get_fd and
    /// ibcm_close. `conn` is 0.
    IBCM_EVENT_SERVICE_GONE = 9,
    /// Passive side: a SIDR_REQ reached one of this context's listeners (`service_id`,
    /// `peer`, `private_data`). `conn` is a new handle: answer it with ibcm_sidr_reply (or
    /// ibcm_reject: status "rejected") before acknowledging the event; acknowledging it
    /// unanswered answers "rejected". The handle is forgotten once answered (no final event).
    IBCM_EVENT_SIDR_REQUEST = 10,
    /// Final, ibcm_sidr_query: the SIDR_REP arrived (`sidr_status`, `remote_qpn`, `qkey`,
    /// `private_data`). A non-success status is still this event. No answer after every
    /// retry is `IBCM_EVENT_UNREACHABLE`.
    IBCM_EVENT_SIDR_REPLY = 11,
    /// A LAP arrived on an established connection (this context answers its LAPs:
    /// ibcm_lap_policy `IBCM_LAP_APPLICATION`): the peer proposes `path` (from this side's
    /// view) as the connection's alternate path, with `private_data`. Load it into the QP
    /// (ibcm_init_alt_path_attr, then `ibv_modify_qp`) and ibcm_lap_accept, or ibcm_lap_reject
    /// (ibcm_mra first for more time), before acknowledging the event: acknowledged
    /// unanswered, the LAP is rejected (APR status 3). One at a time per connection.
    IBCM_EVENT_LAP = 12,
    /// ibcm_load_alt_path: the peer's APR arrived (`apr_status`: 0 "path loaded", then load
    /// the path into the QP with ibcm_init_alt_path_attr; any other, the path is not loaded;
    /// `additional_info`, `private_data`). `status` is `IBCM_OK` whatever `apr_status`.
    IBCM_EVENT_APR = 13,
    /// ibcm_load_alt_path: the LAP exchange ended without an APR (`status`:
    /// `IBCM_ETIMEDOUT` when the peer never answered, `IBCM_ESTATE` when the connection
    /// could not take a LAP, `IBCM_ECLOSED`, `IBCM_EREFUSED` the daemon's quota; `reason`).
    /// The connection stays on the paths it had.
    IBCM_EVENT_LAP_ERROR = 14,
}

/// Transports of ibcm_conn_param.transport and ibcm_event.transport.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ibcm_transport {
    /// Reliable connected.
    IBCM_TRANSPORT_RC = 0,
    /// Unreliable connected.
    IBCM_TRANSPORT_UC = 1,
    /// XRC: this side an XRC INI (active), the peer's daemon an XRC target.
    IBCM_TRANSPORT_XRC = 2,
}

/// Ownership policy of the TGT QPs an XRC service creates (ibcm_xrc_listen).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ibcm_xrc_policy {
    /// The QP lives until its owner (this context) destroys it (ibcm_xrc_destroy); it
    /// survives this process as an orphan.
    IBCM_XRC_EXPLICIT = 0,
    /// The QP lives as long as its domain (this context's private domain in the daemon):
    /// it ends when this context's connection to the daemon ends.
    IBCM_XRC_DOMAIN = 1,
    /// The QP ends when its creating process (this context) exits or detaches.
    IBCM_XRC_PROCESS = 2,
    /// The QP lives as long as a registration holds it, in the daemon's shared domain.
    IBCM_XRC_SHARED = 3,
}

/// What an `IBCM_EVENT_XRC_REPORT` reports (`struct ibcm_event.xrc_report`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ibcm_xrc_report {
    /// Not an XRC report.
    IBCM_XRC_NONE = 0,
    /// The daemon accepted a REQ onto a TGT QP (created or attached).
    IBCM_XRC_ACCEPTED = 1,
    /// The daemon rejected a REQ for the service.
    IBCM_XRC_REJECTED = 2,
    /// A connection on a TGT QP is established (the RTU arrived).
    IBCM_XRC_ESTABLISHED = 3,
    /// A TGT QP went away and its connections got a DREQ or REJ saying why.
    IBCM_XRC_TEARDOWN = 4,
    /// A connection on a TGT QP closed.
    IBCM_XRC_CLOSED = 5,
    /// Another report (the line says what).
    IBCM_XRC_OTHER = 6,
    /// A TGT QP this context created or registered on is gone (`remote_qpn`; `reason`:
    /// "qp-gone qpn=N cause=…", e.g. "creator exited"): its registrations ended with it.
    IBCM_XRC_QP_GONE = 7,
}

/// Target states of ibcm_init_qp_attr (`enum ibv_qp_state` values).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ibcm_qp_state {
    /// `IBV_QPS_INIT`.
    IBCM_QPS_INIT = 1,
    /// `IBV_QPS_RTR`.
    IBCM_QPS_RTR = 2,
    /// `IBV_QPS_RTS`.
    IBCM_QPS_RTS = 3,
}

/// Who answers the LAPs that arrive on this context's connections (ibcm_lap_policy).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ibcm_lap_policy {
    /// The daemon answers each at once with APR status 2, "unsupported" (the default).
    IBCM_LAP_UNSUPPORTED = 0,
    /// Each comes as an `IBCM_EVENT_LAP`, for this context to answer.
    IBCM_LAP_APPLICATION = 1,
}

/// Which path of a connection ibcm_query_path gives.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ibcm_path_kind {
    /// The primary path: the REQ's, or after ibcm_path_migrated the alternate it migrated to.
    IBCM_PATH_PRIMARY = 0,
    /// The alternate path: the REQ's, or the last one a LAP exchange loaded (APR status 0).
    IBCM_PATH_ALTERNATE = 1,
}

/// Link layer of the local port (`IBV_LINK_LAYER_*` values).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ibcm_link_layer {
    /// Native InfiniBand.
    IBCM_LINK_LAYER_INFINIBAND = 1,
    /// RoCE.
    IBCM_LINK_LAYER_ETHERNET = 2,
}

/// The QP type of this side of a connection (`enum ibv_qp_type` values).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ibcm_qp_type {
    /// `IBV_QPT_RC`.
    IBCM_QPT_RC = 2,
    /// `IBV_QPT_UC`.
    IBCM_QPT_UC = 3,
    /// `IBV_QPT_XRC_SEND` (the XRC INI).
    IBCM_QPT_XRC_SEND = 9,
    /// `IBV_QPT_XRC_RECV` (the XRC TGT).
    IBCM_QPT_XRC_RECV = 10,
}

/// ibcm_conn_param.flags: stop at the REP (`IBCM_EVENT_CONNECT_RESPONSE`) so that the QP
/// can be moved to RTR and RTS before the RTU (ibcm_establish sends it). Without it the RTU
/// goes out as soon as the REP arrives and the first event is `IBCM_EVENT_ESTABLISHED`.
pub const IBCM_CONNECT_MANUAL_RTU: u32 = 1;
/// ibcm_conn_param.flags: use `starting_psn` (else the endpoint draws a random one).
pub const IBCM_CONNECT_PSN: u32 = 2;
/// ibcm_conn_param.flags: the local QPN may be shared with other live connections (an XRC
/// INI QP used for several targets or services).
pub const IBCM_CONNECT_SHARED_QPN: u32 = 4;
/// ibcm_conn_param.flags: connect to an rdma_cm listener (Linux `rdma_listen`, librdmacm's
/// `rping -s`, …): `peer` is its "IP:PORT" (the port it listens on, not a UDP port: the CM
/// is reached on UDP 4791), `service_id` must be 0 (it is the port's, in the TCP port space;
/// the IB port space for XRC), and the REQ carries rdma_cm's CMA header in front of the
/// private data (then at most `IBCM_REQ_RDMA_CM_PRIVATE_DATA_MAX` bytes), from the node
/// service's address and a port of this library's choosing.
pub const IBCM_CONNECT_RDMA_CM: u32 = 8;
/// ibcm_conn_param.flags: with a "lid:N" / "gid:G" peer, also ask the daemon for an
/// alternate path (another SLID and DLID between the same ports, for Automatic Path
/// Migration: a fabric whose SM gives ports more than one LID, LMC > 0) and send it in the
/// REQ; ibcm_init_qp_attr's RTR attributes then load it (`IBV_QP_ALT_PATH`). When the SA has
/// none, the REQ goes without (ibcm_query_path `IBCM_PATH_ALTERNATE` says `IBCM_ESTATE`). An
/// IP peer, or with `IBCM_CONNECT_RDMA_CM`: `IBCM_EINVAL`; a daemon that does not serve
/// path migration: `IBCM_EUNSUPPORTED`.
pub const IBCM_CONNECT_ALT_PATH: u32 = 16;

/// rdma_cm's TCP port space (`RDMA_PS_TCP`, RC), for ibcm_rdma_cm_service_id.
pub const IBCM_PS_TCP: u16 = 0x0106;
/// rdma_cm's UDP port space (`RDMA_PS_UDP`, UD: SIDR), for ibcm_rdma_cm_service_id.
pub const IBCM_PS_UDP: u16 = 0x0111;
/// rdma_cm's IB port space (`RDMA_PS_IB`, any QP type; XRC), for ibcm_rdma_cm_service_id.
pub const IBCM_PS_IB: u16 = 0x013f;

/// The largest private data of a REQ (`ibcm_conn_param`).
pub const IBCM_REQ_PRIVATE_DATA_MAX: u32 = 92;
/// The largest private data of a REQ with `IBCM_CONNECT_RDMA_CM` (92 less the 36-byte CMA
/// header).
pub const IBCM_REQ_RDMA_CM_PRIVATE_DATA_MAX: u32 = 56;
/// The largest private data of a SIDR_REQ (`ibcm_sidr_param`).
pub const IBCM_SIDR_REQ_PRIVATE_DATA_MAX: u32 = 216;
/// The largest private data of a SIDR_REP (`ibcm_sidr_rep_param`).
pub const IBCM_SIDR_REP_PRIVATE_DATA_MAX: u32 = 136;
/// The largest private data of a REP (`ibcm_accept_param`).
pub const IBCM_REP_PRIVATE_DATA_MAX: u32 = 196;
/// The largest private data of a REJ (ibcm_reject).
pub const IBCM_REJ_PRIVATE_DATA_MAX: u32 = 148;
/// The largest private data of an RTU (ibcm_establish).
pub const IBCM_RTU_PRIVATE_DATA_MAX: u32 = 224;
/// The largest private data of a DREQ (ibcm_disconnect).
pub const IBCM_DREQ_PRIVATE_DATA_MAX: u32 = 220;
/// The largest private data of a LAP (ibcm_load_alt_path).
pub const IBCM_LAP_PRIVATE_DATA_MAX: u32 = 168;
/// The largest private data of an APR (ibcm_lap_accept, ibcm_lap_reject).
pub const IBCM_APR_PRIVATE_DATA_MAX: u32 = 148;
/// The largest additional information of an APR (ibcm_lap_reject).
pub const IBCM_APR_INFO_MAX: u32 = 72;
/// The most SRQ numbers an XRC REP announces (ibcm_xrc_listen's `n_srqns`).
pub const IBCM_XRC_SRQNS_MAX: u32 = 47;

/// The longest message of ibcm_xrc_send (one SEND Only of a 1024-byte path MTU, the default;
/// a smaller path MTU is smaller), and the room ibcm_xrc_srq_recv needs.
pub const IBCM_XRC_MESSAGE_MAX: u32 = 1024;
/// The most unpolled messages an XRC SRQ of ibcm_xrc_srq_create holds (its `max_wr`).
pub const IBCM_XRC_SRQ_MAX_WR: u32 = 256;

/// ibcm_xrcd_open flags: create the domain if its file names none yet (`O_CREAT`).
pub const IBCM_XRCD_CREATE: u32 = 1;
/// ibcm_xrcd_open flags: with `IBCM_XRCD_CREATE`, fail if the file names a domain already
/// (`O_EXCL`).
pub const IBCM_XRCD_EXCL: u32 = 2;
/// The longest domain name (ibcm_xrcd_open, …), in bytes.
pub const IBCM_XRCD_NAME_MAX: u32 = 255;

/// What ibcm_connect asks for. Fill it with ibcm_conn_param_init first: it sets rdma_cm's
/// defaults, which a zeroed struct does not have.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibcm_conn_param {
    /// The peer's CM: its IP address ("10.0.0.2": UDP port 4791, RoCEv2) or "IP:PORT"; or,
    /// through an `ibcmd` on a native InfiniBand port, "lid:N" (decimal or 0x hex, a unicast
    /// LID) or "gid:G" (IPv6 notation): the daemon asks its SA for the path (a PathRecord
    /// Get; before the REQ, so ibcm_connect does not wait for it) and the REQ gets the
    /// path's primary path, P_Key, packet life time and MTU (`path_mtu` at most), the peer's
    /// CM at the path's DLID. A path that cannot be had ends the handle with
    /// `CONNECT_ERROR` (status `IBCM_ENOPATH`, or `IBCM_EUNSUPPORTED` through a daemon that
    /// is not on an InfiniBand port).
    pub peer: *const c_char,
    /// The service ID to connect to.
    pub service_id: u64,
    /// The local QP number (24 bits, not 0); for XRC the INI QP.
    pub qp_num: u32,
    /// `ibcm_transport` (default RC).
    pub transport: u32,
    /// `IBCM_CONNECT_*` bits (default 0).
    pub flags: u32,
    /// With `IBCM_CONNECT_PSN`: the PSN the local QP expects first (24 bits).
    pub starting_psn: u32,
    /// REQ private data (`private_data_len` bytes, at most `IBCM_REQ_PRIVATE_DATA_MAX`);
    /// may be NULL when the length is 0. Copied by ibcm_connect.
    pub private_data: *const u8,
    /// Length of `private_data`.
    pub private_data_len: u32,
    /// Give up when the peer has not answered after this many milliseconds (default
    /// 10000); 0: only the REQ retries bound the wait (about 100 s).
    pub timeout_ms: u32,
    /// RDMA read/atomic responder resources offered (default 16).
    pub responder_resources: u8,
    /// RDMA read/atomic initiator depth wanted (default 16).
    pub initiator_depth: u8,
    /// Transport retry count, 0..7 (default 7).
    pub retry_count: u8,
    /// RNR retry count, 0..7, 7 = infinite (default 7).
    pub rnr_retry_count: u8,
    /// Path MTU as `enum ibv_mtu` (1 = 256 … 5 = 4096; default 3 = 1024). With a "lid:" or
    /// "gid:" peer the REQ's is the smaller of this and the path's.
    pub path_mtu: u8,
    /// Non-zero: the local QP uses an SRQ (default 0).
    pub srq: u8,
    /// The application's pointer for this connection (default NULL): every event of the
    /// handle carries it (`ibcm_event.context`), as rdma_cm's `id->context`.
    pub context: *mut c_void,
}

/// What ibcm_accept puts in the REP. Fill it with ibcm_accept_param_init first.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibcm_accept_param {
    /// The local QP number (24 bits, not 0).
    pub qp_num: u32,
    /// The PSN the local QP expects first (24 bits; ibcm_accept_param_init draws one).
    pub starting_psn: u32,
    /// REP private data (at most `IBCM_REP_PRIVATE_DATA_MAX` bytes); may be NULL when the
    /// length is 0. Copied by ibcm_accept.
    pub private_data: *const u8,
    /// Length of `private_data`.
    pub private_data_len: u32,
    /// Responder resources (default 16).
    pub responder_resources: u8,
    /// Initiator depth (default 16).
    pub initiator_depth: u8,
    /// RNR retry count, 0..7 (default 7).
    pub rnr_retry_count: u8,
    /// Non-zero: the local QP uses an SRQ (default 0).
    pub srq: u8,
}

/// What ibcm_init_qp_attr needs to know about the local port that the messages do not say.
/// NULL stands for port 1, P_Key index 0, GID index 0, LMC 0, RoCE.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibcm_port {
    /// Port number (1-based).
    pub port_num: u8,
    /// Index of the local GID in the port's GID table.
    pub sgid_index: u8,
    /// The port's LID mask control (IB; 0 on RoCE).
    pub lmc: u8,
    /// Index of the connection's P_Key in the port's P_Key table.
    pub pkey_index: u16,
    /// `ibcm_link_layer`.
    pub link_layer: u32,
}

/// A path of a connection as the CM messages carry it (a REQ's primary or alternate path, a
/// LAP's), written from this side's view: `local_*` is this side's port, `remote_*` the
/// peer's (a LAP and a passive side's REQ carry it the other way round: the library turns
/// them). The fields of the IBTA path record the CM uses.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ibcm_path {
    /// This side's port GID.
    pub local_gid: [u8; 16],
    /// The peer's port GID.
    pub remote_gid: [u8; 16],
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// This side's port LID (0xFFFF, permissive, for a path that leaves the subnet).
    pub local_lid: u16,
    /// The peer's port LID.
    pub remote_lid: u16,
    /// Packet rate (IBTA rate code, the values of `enum ibv_rate`; 6 bits).
    pub rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// 1 when the path does not leave the subnet, else 0.
    pub subnet_local: u8,
    /// Local ACK timeout exponent (5 bits): 4.096 µs × 2^N, what the receiving QP's
    /// `timeout` is derived from.
    pub local_ack_timeout: u8,
}

/// The global route of an address vector (`struct ibv_global_route`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibcm_global_route {
    /// Destination GID.
    pub dgid: [u8; 16],
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Source GID index.
    pub sgid_index: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
}

/// An address vector (`struct ibv_ah_attr`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibcm_ah_attr {
    /// The GRH; meaningful when `is_global` is 1.
    pub grh: ibcm_global_route,
    /// Destination LID (0 on RoCE).
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// Source path bits.
    pub src_path_bits: u8,
    /// Static rate (`enum ibv_rate`).
    pub static_rate: u8,
    /// 1 when the path has a GRH.
    pub is_global: u8,
    /// Local port.
    pub port_num: u8,
}

/// QP attributes for one transition (the fields of `struct ibv_qp_attr` the CM sets). Only
/// the fields named by the mask ibcm_init_qp_attr returns are meaningful; the mask bits are
/// `enum ibv_qp_attr_mask`'s (`IBV_QP_STATE` = 1 << 0 … `IBV_QP_DEST_QPN` = 1 << 20).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibcm_qp_attr {
    /// Target state (`enum ibv_qp_state`).
    pub qp_state: u32,
    /// `enum ibv_access_flags` bits (INIT).
    pub qp_access_flags: u32,
    /// P_Key index (INIT).
    pub pkey_index: u16,
    /// Local port (INIT).
    pub port_num: u8,
    /// Path MTU, `enum ibv_mtu` (RTR).
    pub path_mtu: u8,
    /// Primary path (RTR).
    pub ah_attr: ibcm_ah_attr,
    /// Remote QP number (RTR; an XRC INI's is the TGT QPN).
    pub dest_qp_num: u32,
    /// First PSN received (RTR).
    pub rq_psn: u32,
    /// RDMA reads / atomics answered at once (RTR).
    pub max_dest_rd_atomic: u8,
    /// Minimum RNR NAK timer code (RTR).
    pub min_rnr_timer: u8,
    /// P_Key index of the alternate path.
    pub alt_pkey_index: u16,
    /// Alternate path.
    pub alt_ah_attr: ibcm_ah_attr,
    /// Local port of the alternate path.
    pub alt_port_num: u8,
    /// ACK timeout of the alternate path.
    pub alt_timeout: u8,
    /// ACK timeout exponent (RTS).
    pub timeout: u8,
    /// Transport retries (RTS).
    pub retry_cnt: u8,
    /// First PSN sent (RTS).
    pub sq_psn: u32,
    /// RNR retries (RTS).
    pub rnr_retry: u8,
    /// RDMA reads / atomics outstanding at once (RTS).
    pub max_rd_atomic: u8,
    /// `enum ibv_mig_state` (RTS with an alternate path).
    pub path_mig_state: u8,
    /// This side's QP type (`ibcm_qp_type`).
    pub qp_type: u8,
}

/// An event. Owned by the library from ibcm_get_event until ibcm_ack_event; its pointers
/// stay valid until then.
///
/// The library allocates every event and an application only reads it through the pointer
/// it is lent, so new fields are only ever appended at the end: a program built against an
/// older header finds every field it knows at the offset it knows. (A program that reads the
/// newer fields needs a library at least as new as its header.)
#[repr(C)]
#[derive(Debug)]
pub struct ibcm_event {
    /// What happened.
    pub event: ibcm_event_type,
    /// For failures: the class as an `ibcm_status` (`IBCM_ECLOSED`, `IBCM_EGONE`, …);
    /// `IBCM_OK` otherwise (a `DISCONNECTED` by a DREQ, either side's, is no failure).
    pub status: ibcm_status,
    /// The connection handle (0 for context events: XRC reports, service gone).
    pub conn: u64,
    /// The local communication ID of the connection, once known (0 in CONNECT_REQUEST and
    /// context events).
    pub comm_id: u32,
    /// CONNECT_REQUEST: the transport asked for (`ibcm_transport`).
    pub transport: u32,
    /// CONNECT_REQUEST: the service ID asked for.
    pub service_id: u64,
    /// CONNECT_REQUEST: the initiator's QPN; CONNECT_RESPONSE / ESTABLISHED (active): the
    /// peer's QPN (XRC: the TGT QPN).
    pub remote_qpn: u32,
    /// CONNECT_REQUEST: the PSN the initiator expects first; CONNECT_RESPONSE: the REP's
    /// starting PSN.
    pub remote_psn: u32,
    /// REJECTED / CONNECT_ERROR: the REJ reason (IBTA table 112), 0 when none.
    pub rej_reason: u16,
    /// DISCONNECTED: 1 when the peer sent the DREQ.
    pub by_peer: u8,
    /// DISCONNECTED / REJECTED: 1 when the DREQ or REJ carried ibcm's XRC "target gone"
    /// block.
    pub target_gone: u8,
    /// XRC_REPORT: which kind.
    pub xrc_report: ibcm_xrc_report,
    /// The peer's CM address: "IP:PORT"; on a native InfiniBand port "lid:N" (a LID-routed
    /// REQ: what ibcm_connect takes back) or "gid:G" (one with a GRH); "" when unknown.
    /// NUL-terminated.
    pub peer: *const c_char,
    /// Why, in words: the final event's cause, the XRC report line; "" otherwise.
    /// NUL-terminated.
    pub reason: *const c_char,
    /// Private data of the REQ (CONNECT_REQUEST), the REP (CONNECT_RESPONSE, and the active
    /// side's ESTABLISHED), the REJ (REJECTED) or the DREQ (DISCONNECTED): the
    /// application's part, after the rdma_cm header when there is one; trailing zeros of
    /// REJ and DREQ trimmed. The passive side's ESTABLISHED carries the RTU's (what the
    /// active side passed to ibcm_establish; none after an automatic RTU), trailing zeros
    /// trimmed.
    pub private_data: *const u8,
    /// Length of `private_data`.
    pub private_data_len: u32,
    /// The handle's context pointer: `ibcm_conn_param.context` (active side), the
    /// listener's (ibcm_listen_context; passive side), or what ibcm_set_context set last.
    /// NULL for context events and handles without one.
    pub context: *mut c_void,
    /// CONNECT_REQUEST / SIDR_REQUEST with rdma_cm's CMA header (an rdma_cm client, or
    /// ibcm with `IBCM_CONNECT_RDMA_CM`): the client's rdma_cm address, "IP:PORT"; ""
    /// otherwise. NUL-terminated.
    pub rdma_cm_src: *const c_char,
    /// As `rdma_cm_src`: the address the client connected to (the listener's IP and
    /// rdma_cm port), "IP:PORT"; "" otherwise. NUL-terminated.
    pub rdma_cm_dst: *const c_char,
    /// SIDR_REPLY: the SIDR_REP's status (IBTA table 119: 0 success, 1 service ID not
    /// supported, 2 rejected, 3 no QP, 4 redirect, 5 unsupported version).
    pub sidr_status: u32,
    /// SIDR_REPLY: the Q_Key of the UD QP that serves the service (`remote_qpn`).
    pub qkey: u32,
    /// LAP: the proposed alternate path, from this side's view; NULL in other events.
    pub path: *const ibcm_path,
    /// APR: the APR's status (IBTA table 121: 0 path loaded, 1 invalid comm ID, 2
    /// unsupported, 3 rejected, 4 redirect, 5 is current path, 6 invalid QPN, 7 invalid LID,
    /// 8 invalid GID, 9 invalid flow label, 10 invalid traffic class, 11 invalid hop limit,
    /// 12 invalid packet rate, 13 invalid SL).
    pub apr_status: u32,
    /// APR: the APR's additional information (`additional_info_len` bytes); may be NULL when
    /// the length is 0.
    pub additional_info: *const u8,
    /// Length of `additional_info`.
    pub additional_info_len: u32,
    /// CONNECT_REQUEST: the REQ's Initiator Depth; CONNECT_RESPONSE / ESTABLISHED (active):
    /// the REP's. 0 otherwise. The peer's initiator depth is this side's responder
    /// resources (the RDMA reads and atomics it must take outstanding at once): the
    /// receiver's view, as the kernel's ib_cm and rdma_cm report it
    /// (`rdma_conn_param.responder_resources`). This field and the ones after it, named
    /// after `struct rdma_conn_param`'s, were appended (see above).
    pub responder_resources: u8,
    /// CONNECT_REQUEST: the REQ's Responder Resources; CONNECT_RESPONSE / ESTABLISHED
    /// (active): the REP's. 0 otherwise. The peer's responder resources are this side's
    /// initiator depth (the RDMA reads and atomics it may have outstanding at the peer):
    /// the receiver's view, as `responder_resources` (`rdma_conn_param.initiator_depth`).
    pub initiator_depth: u8,
    /// CONNECT_REQUEST: the REQ's End-to-End Flow Control bit; CONNECT_RESPONSE / ESTABLISHED
    /// (active): the REP's. 0 otherwise.
    pub flow_control: u8,
    /// CONNECT_REQUEST: the REQ's transport Retry Count (0..7); 0 otherwise (a REP carries
    /// none).
    pub retry_count: u8,
    /// CONNECT_REQUEST: the REQ's RNR Retry Count (0..7, 7 = infinite); CONNECT_RESPONSE /
    /// ESTABLISHED (active): the REP's. 0 otherwise.
    pub rnr_retry_count: u8,
    /// CONNECT_REQUEST: the REQ's SRQ bit (1: the initiator's QP uses an SRQ);
    /// CONNECT_RESPONSE / ESTABLISHED (active): the REP's (the responder's QP). 0 otherwise.
    pub srq: u8,
    /// CONNECT_REQUEST: the REQ's path MTU as `enum ibv_mtu` (1 = 256 … 5 = 4096); 0
    /// otherwise (a REP carries none).
    pub path_mtu: u8,
}

/// What ibcm_sidr_query sends. Fill it with ibcm_sidr_param_init first.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibcm_sidr_param {
    /// The peer's CM: its IP address (UDP port 4791) or "IP:PORT" ("lid:" and "gid:" peers
    /// are ibcm_connect's only: `IBCM_EUNSUPPORTED`).
    pub peer: *const c_char,
    /// The service ID to resolve.
    pub service_id: u64,
    /// SIDR_REQ private data (at most `IBCM_SIDR_REQ_PRIVATE_DATA_MAX` bytes); may be NULL
    /// when the length is 0. Copied by ibcm_sidr_query.
    pub private_data: *const u8,
    /// Length of `private_data`.
    pub private_data_len: u32,
    /// Time to wait for the SIDR_REP per attempt, in milliseconds (default 4096, rdma_cm's;
    /// the node service clamps it: docs/ibcmd.md).
    pub timeout_ms: u32,
    /// Retransmissions before `IBCM_EVENT_UNREACHABLE` (default 15, rdma_cm's; clamped as
    /// `timeout_ms`).
    pub max_retries: u8,
    /// The application's pointer for this request: its event carries it.
    pub context: *mut c_void,
}

/// What ibcm_sidr_reply answers a SIDR_REQ with.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibcm_sidr_rep_param {
    /// The SIDR_REP status (IBTA table 119; 0 = success).
    pub status: u32,
    /// The UD QP that serves the service (24 bits; with status 0, not 0).
    pub qp_num: u32,
    /// Its Q_Key.
    pub qkey: u32,
    /// SIDR_REP private data (at most `IBCM_SIDR_REP_PRIVATE_DATA_MAX` bytes); may be NULL
    /// when the length is 0.
    pub private_data: *const u8,
    /// Length of `private_data`.
    pub private_data_len: u32,
}

/// What ibcm_xrc_tgt_query reports of a TGT QP (OFED's `ibv_query_xrc_rcv_qp`, plus its
/// ownership).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibcm_xrc_tgt_info {
    /// The QP number.
    pub qpn: u32,
    /// Its policy (`ibcm_xrc_policy`).
    pub policy: c_int,
    /// 1 while the QP lives; 0 once it is gone (`reason` says why).
    pub live: u8,
    /// Its state as `enum ibv_qp_state` (0 RESET, 1 INIT, 2 RTR, 3 RTS, …, 6 ERR).
    pub qp_state: u32,
    /// The creating process's PID (0 when unknown).
    pub creator_pid: u32,
    /// The owner's PID (0: none, an orphan or a shared QP).
    pub owner_pid: u32,
    /// Registrations held on it (processes' and connections', counted with multiplicity).
    pub registrations: u32,
    /// Connections on it.
    pub connections: u32,
    /// Why it is gone ("" while live). NUL-terminated.
    pub reason: [c_char; 128],
}

/// One counter of the node service's CM endpoint (ibcm_query_counters).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibcm_counter {
    /// Its name ("established", "dropped.wrong_peer", …: docs/ibcmd.md), a static
    /// NUL-terminated string (valid as long as the library is loaded).
    pub name: *const c_char,
    /// Its value.
    pub value: u64,
}

/// A C `int` status of a call.
pub(crate) fn code(s: ibcm_status) -> c_int {
    s as c_int
}
