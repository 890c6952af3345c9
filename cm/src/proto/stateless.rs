//! The public side of the stateless mode under pressure (docs/protocol.md §5.12): what a
//! listener presets for the REQs it answers without an application ([`StatelessAccept`]), and
//! what the application learns when such a connection is established ([`StatelessInfo`]).

use ibcm_mad::{Qpn, Rep};

use super::{AcceptParams, ReqInfo};

/// The answer a listener presets for the REQs the endpoint answers **statelessly** under
/// pressure ([`Endpoint::set_stateless`](super::Endpoint::set_stateless)): the REP is sent at
/// once, from this template, without asking the application and without a connection entry;
/// the connection is made when the peer's RTU comes back with a valid cookie.
///
/// The REP's local comm ID is the cookie; its start PSN and local QPN are derived from the
/// same keyed hash (so that a repeated REQ gets the same REP byte for byte).
///
/// ```
/// use ibcm::proto::{AcceptParams, StatelessAccept};
/// use ibcm_mad::Qpn;
/// // QPNs 0x100000 … 0x1fffff for stateless connections; the rest of the REP as `new` sets it.
/// let t = StatelessAccept::new(AcceptParams::new(Qpn::masked(0)), Qpn::masked(0x10_0000), 0x10_0000);
/// assert_eq!(t.qpn_count, 0x10_0000);
/// ```
#[derive(Debug, Clone)]
pub struct StatelessAccept {
    /// The REP template: responder resources, initiator depth, target ACK delay, failover,
    /// flow control, RNR retry count, SRQ and private data are sent as they are. Its
    /// `local_qpn` and `starting_psn` are ignored (see [`qpn_base`](Self::qpn_base)); XRC
    /// fields are ignored too (XRC REQs are always answered with state).
    pub rep: AcceptParams,
    /// First QPN of the range the REP's local QPN is drawn from.
    pub qpn_base: Qpn,
    /// Size of that range (at least 1; the QPN is `qpn_base + h mod qpn_count` for a keyed
    /// hash `h` of the REQ, kept inside the 24-bit space). When the RTU arrives and that QPN
    /// is in use or in TimeWait quarantine, the connection is refused (REJ 3): a larger range
    /// makes that rarer.
    pub qpn_count: u32,
}

impl StatelessAccept {
    /// A template answering with `rep` onto QPNs `qpn_base .. qpn_base + qpn_count`.
    pub fn new(rep: AcceptParams, qpn_base: Qpn, qpn_count: u32) -> Self {
        StatelessAccept {
            rep,
            qpn_base,
            qpn_count: qpn_count.max(1),
        }
    }
}

/// A passive connection the endpoint established statelessly (the payload of
/// [`EventKind::StatelessEstablished`](super::EventKind::StatelessEstablished)): the REQ it
/// answered, the REP it sent, and the RTU's private data. The connection is ESTABLISHED when
/// the application learns of it; the application brings its QP up now (RTR and RTS at once,
/// from `req` and `rep`), not before the REP as in the stateful order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatelessInfo {
    /// The REQ, as received (its private data included).
    pub req: ReqInfo,
    /// The REP as sent: the local QPN and start PSN the cookie chose.
    pub rep: Rep,
    /// The RTU's private data (trailing zeros trimmed).
    pub rtu_private_data: Vec<u8>,
}

impl StatelessInfo {
    /// The local QPN the connection uses.
    pub fn local_qpn(&self) -> Qpn {
        self.rep.local_qpn
    }
}
