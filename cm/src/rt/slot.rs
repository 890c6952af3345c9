//! The per-connection state the driver shares with the [`Connection`](super::Connection)
//! handles: the status (with a wake-up for waiters) and, on the active side, the REP.
//!
//! It is the runtime's whole per-connection cost besides the core's table, so it is kept
//! small: one allocation (`Arc<Slot>`, 80 bytes: a mutex, the status as a tag with the error
//! boxed, one [`Notify`]) per connection,
//! plus the REP in a compact form (its fixed fields and its private data without trailing
//! zeros, usually none) on the active side. A `tokio::sync::watch` channel per connection
//! cost ~400 bytes (eight `Notify`s inside) and the REP as received 260 more.

use std::sync::{Arc, Mutex, MutexGuard};

use dashmap::DashMap;
use ibcm_mad::{
    CommId, Eecn, FailoverAccepted, Guid, PrivateData, Psn, Qkey, Qpn, Rep, TimeoutExp, VendorId,
    U3,
};
use tokio::sync::Notify;

use super::types::ConnStatus;
use crate::proto::{ConnId, ConnectionError, RepInfo};

/// One connection's shared state.
#[derive(Debug)]
pub(crate) struct Slot {
    inner: Mutex<Inner>,
    notify: Notify,
}

#[derive(Debug)]
struct Inner {
    /// The [`ConnStatus`] in 16 bytes instead of 64: its variant, and the error of `Closed`
    /// and `Gone` boxed (an established connection has none).
    phase: Phase,
    error: Option<Box<ConnectionError>>,
    rep: Option<Box<CompactRep>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Connecting,
    Established,
    Closed,
    Gone,
}

impl Inner {
    fn status(&self) -> ConnStatus {
        let e = || {
            self.error
                .as_deref()
                .cloned()
                .unwrap_or(ConnectionError::LocallyClosed)
        };
        match self.phase {
            Phase::Connecting => ConnStatus::Connecting,
            Phase::Established => ConnStatus::Established,
            Phase::Closed => ConnStatus::Closed(e()),
            Phase::Gone => ConnStatus::Gone(e()),
        }
    }

    fn set(&mut self, st: ConnStatus) {
        (self.phase, self.error) = match st {
            ConnStatus::Connecting => (Phase::Connecting, None),
            ConnStatus::Established => (Phase::Established, None),
            ConnStatus::Closed(e) => (Phase::Closed, Some(Box::new(e))),
            ConnStatus::Gone(e) => (Phase::Gone, Some(Box::new(e))),
        };
    }
}

impl Slot {
    /// A connection being set up.
    pub(crate) fn new() -> Arc<Slot> {
        Arc::new(Slot {
            inner: Mutex::new(Inner {
                phase: Phase::Connecting,
                error: None,
                rep: None,
            }),
            notify: Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Nothing panics while holding the lock; a poisoned one still holds a whole value.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current status.
    pub(crate) fn status(&self) -> ConnStatus {
        self.lock().status()
    }

    /// Sets the status and wakes every waiter.
    pub(crate) fn set(&self, status: ConnStatus) {
        self.lock().set(status);
        self.notify.notify_waiters();
    }

    /// Sets the status computed from the current one, and wakes every waiter.
    pub(crate) fn update(&self, f: impl FnOnce(&ConnStatus) -> ConnStatus) {
        {
            let mut g = self.lock();
            let st = f(&g.status());
            g.set(st);
        }
        self.notify.notify_waiters();
    }

    /// Keeps the REP the active side received, and wakes every waiter
    /// ([`Slot::wait_rep`]).
    pub(crate) fn set_rep(&self, rep: &RepInfo) {
        self.lock().rep = Some(Box::new(CompactRep::new(rep)));
        self.notify.notify_waiters();
    }

    /// Forgets the REP (the connection left the table).
    pub(crate) fn clear_rep(&self) {
        self.lock().rep = None;
    }

    /// The REP, as received.
    pub(crate) fn rep(&self) -> Option<RepInfo> {
        self.lock().rep.as_deref().map(CompactRep::to_info)
    }

    /// Waits until the REP has arrived (`Ok`, the REP) or the connection has closed without
    /// one (`Err`, why).
    pub(crate) async fn wait_rep(&self) -> Result<RepInfo, ConnectionError> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let g = self.lock();
                if let Some(rep) = g.rep.as_deref() {
                    return Ok(rep.to_info());
                }
                match g.status() {
                    ConnStatus::Closed(e) | ConnStatus::Gone(e) => return Err(e),
                    // Established without a REP kept: an app consumed the event.
                    ConnStatus::Established => {
                        return Err(ConnectionError::LocallyClosed);
                    }
                    ConnStatus::Connecting => {}
                }
            }
            notified.await;
        }
    }

    /// Waits until `f` returns `Some` for the status.
    pub(crate) async fn wait<R>(&self, mut f: impl FnMut(&ConnStatus) -> Option<R>) -> R {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            // Registered before the check: a change between the check and the await wakes it.
            notified.as_mut().enable();
            let st = self.lock().status();
            if let Some(r) = f(&st) {
                return r;
            }
            notified.await;
        }
    }
}

/// A [`RepInfo`] without the REP's 196-byte private data field: its content without trailing
/// zeros instead (which the REP's zero padding restores).
#[derive(Debug)]
struct CompactRep {
    local_comm_id: CommId,
    remote_comm_id: CommId,
    local_qkey: Qkey,
    local_qpn: Qpn,
    ece_vendor_id: VendorId,
    local_eecn: Eecn,
    starting_psn: Psn,
    responder_resources: u8,
    initiator_depth: u8,
    target_ack_delay: TimeoutExp,
    failover_accepted: FailoverAccepted,
    end_to_end_flow_control: bool,
    rnr_retry_count: U3,
    srq: bool,
    local_ca_guid: Guid,
    private_data: Box<[u8]>,
    remote_qpn: Qpn,
}

impl CompactRep {
    fn new(i: &RepInfo) -> Self {
        let r = &i.rep;
        CompactRep {
            local_comm_id: r.local_comm_id,
            remote_comm_id: r.remote_comm_id,
            local_qkey: r.local_qkey,
            local_qpn: r.local_qpn,
            ece_vendor_id: r.ece_vendor_id,
            local_eecn: r.local_eecn,
            starting_psn: r.starting_psn,
            responder_resources: r.responder_resources,
            initiator_depth: r.initiator_depth,
            target_ack_delay: r.target_ack_delay,
            failover_accepted: r.failover_accepted,
            end_to_end_flow_control: r.end_to_end_flow_control,
            rnr_retry_count: r.rnr_retry_count,
            srq: r.srq,
            local_ca_guid: r.local_ca_guid,
            private_data: r.private_data.trimmed().into(),
            remote_qpn: i.remote_qpn,
        }
    }

    fn to_info(&self) -> RepInfo {
        RepInfo {
            rep: Rep {
                local_comm_id: self.local_comm_id,
                remote_comm_id: self.remote_comm_id,
                local_qkey: self.local_qkey,
                local_qpn: self.local_qpn,
                ece_vendor_id: self.ece_vendor_id,
                local_eecn: self.local_eecn,
                starting_psn: self.starting_psn,
                responder_resources: self.responder_resources,
                initiator_depth: self.initiator_depth,
                target_ack_delay: self.target_ack_delay,
                failover_accepted: self.failover_accepted,
                end_to_end_flow_control: self.end_to_end_flow_control,
                rnr_retry_count: self.rnr_retry_count,
                srq: self.srq,
                local_ca_guid: self.local_ca_guid,
                private_data: PrivateData::from_slice(&self.private_data).unwrap_or_default(),
            },
            remote_qpn: self.remote_qpn,
        }
    }
}

/// The registry the handles read: connection ID → its [`Slot`] (status, REP), written by the
/// driver only, removed when the connection leaves the table.
pub(crate) type Registry = Arc<DashMap<ConnId, Arc<Slot>>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_rep_round_trips() {
        let mut rep = Rep {
            local_comm_id: CommId(7),
            local_qpn: Qpn::masked(0x1234),
            starting_psn: Psn::masked(0xabcdef),
            local_ca_guid: Guid(99),
            srq: true,
            ..Rep::default()
        };
        rep.private_data.0[..3].copy_from_slice(&[1, 0, 2]);
        let info = RepInfo {
            rep,
            remote_qpn: Qpn::masked(0x55),
        };
        let c = CompactRep::new(&info);
        assert_eq!(&*c.private_data, &[1, 0, 2]);
        assert_eq!(c.to_info(), info);
        let empty = RepInfo {
            rep: Rep::default(),
            remote_qpn: Qpn::masked(3),
        };
        assert_eq!(CompactRep::new(&empty).to_info(), empty);
    }

    #[test]
    fn slot_is_small() {
        // The point of the slot: well under the ~400 bytes of a watch channel.
        assert!(
            std::mem::size_of::<Slot>() <= 64,
            "{}",
            std::mem::size_of::<Slot>()
        );
        assert!(std::mem::size_of::<CompactRep>() <= 80);
    }

    #[tokio::test]
    async fn waiters_see_every_change() {
        let s = Slot::new();
        let s2 = s.clone();
        let w = tokio::spawn(async move {
            s2.wait(|st| matches!(st, ConnStatus::Established).then_some(()))
                .await;
        });
        tokio::task::yield_now().await;
        s.set(ConnStatus::Established);
        w.await.unwrap();
        assert_eq!(s.status(), ConnStatus::Established);
        let e = ConnectionError::Disconnected {
            by_peer: true,
            private_data: b"bye".to_vec(),
        };
        s.set(ConnStatus::Closed(e.clone()));
        assert_eq!(s.status(), ConnStatus::Closed(e.clone()));
        s.update(|st| match st {
            ConnStatus::Closed(e) => ConnStatus::Gone(e.clone()),
            other => other.clone(),
        });
        assert_eq!(s.status(), ConnStatus::Gone(e));
    }
}
