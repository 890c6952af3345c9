//! The per-connection state the driver shares with the [`Connection`](super::Connection)
//! handles: the connection's ID, its status (with wake-ups for waiters) and, on the active
//! side, the REP.
//!
//! It is the runtime's whole per-connection cost besides the core's table, so it is kept
//! small. A slot is one 24-byte allocation ([`SlotRef`], a reference-counted pointer without a
//! weak count: a 32-byte heap chunk): the ID, the phase of the status in one byte, and one
//! pointer to what a connection has only sometimes ([`Extra`]): the REP's fixed fields packed
//! into 40 bytes (active side), and, rarer still, behind one more pointer, the REP's private
//! data, the error of a closed connection and the wakers of tasks waiting for a change. An
//! established passive connection nobody waits on has none of it. The pointer is guarded by
//! one of [`STRIPES`] process-wide locks picked by the connection ID (a lock per slot would
//! double its size). A `tokio::sync::watch` channel per connection cost ~400 bytes, a
//! `Mutex` with a `Notify` 80.
//!
//! The registry that finds a slot by connection ID ([`Registry`]) is one hash table of slot
//! pointers keyed by the ID each slot holds: 8 bytes and a control byte per bucket.

use std::future::poll_fn;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Waker};

use crossbeam_utils::atomic::AtomicCell;
use hashbrown::HashTable;
use ibcm_mad::{
    CommId, Eecn, FailoverAccepted, Guid, PrivateData, Psn, Qkey, Qpn, Rep, TimeoutExp, VendorId,
    U3,
};

use super::types::ConnStatus;
use crate::proto::{ConnId, ConnectionError, RepInfo};

/// A shared pointer to a [`Slot`].
pub(crate) type SlotRef = triomphe::Arc<Slot>;

/// How many locks guard the slots' [`Extra`] parts (by connection ID).
const STRIPES: usize = 64;

static LOCKS: [Mutex<()>; STRIPES] = [const { Mutex::new(()) }; STRIPES];

/// Names each waiting future, so that it can take its waker out when dropped.
static NEXT_WAITER: AtomicU64 = AtomicU64::new(1);

/// One connection's shared state.
pub(crate) struct Slot {
    /// Taken out (under the connection's stripe lock) while it is read or changed.
    extra: AtomicCell<Option<Box<Extra>>>,
    id: ConnId,
    /// A [`Phase`]; written under the stripe lock.
    phase: AtomicU8,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot")
            .field("id", &self.id)
            .field("phase", &self.phase.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

const CONNECTING: u8 = 0;
const ESTABLISHED: u8 = 1;
const CLOSED: u8 = 2;
const GONE: u8 = 3;

/// What a connection has only sometimes.
#[derive(Debug, Default)]
struct Extra {
    /// The REP's fixed fields ([`pack_rep`]).
    rep: Option<[u8; REP_LEN]>,
    more: Option<Box<More>>,
}

/// What a connection has more rarely still.
#[derive(Debug, Default)]
struct More {
    /// The REP's private data without trailing zeros (which the REP's zero padding restores).
    private_data: Box<[u8]>,
    /// Why a `Closed` or `Gone` connection closed.
    error: Option<ConnectionError>,
    /// The tasks waiting for a change, by waiter.
    wakers: Vec<(u64, Waker)>,
}

impl More {
    fn is_empty(&self) -> bool {
        self.private_data.is_empty() && self.error.is_none() && self.wakers.is_empty()
    }
}

/// The slot's [`Extra`], taken out under its stripe lock; put back (and freed when empty) on
/// drop.
struct Guard<'a> {
    slot: &'a Slot,
    /// The slot's box, kept (not moved out of it) while the lock is held, so that a lock
    /// costs no allocation; created on the first change that needs it.
    extra: Option<Box<Extra>>,
    _lock: MutexGuard<'static, ()>,
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        let mut extra = self.extra.take();
        if let Some(x) = extra.as_mut() {
            if x.more.as_deref().is_some_and(More::is_empty) {
                x.more = None;
            }
        }
        let keep = extra.filter(|x| x.rep.is_some() || x.more.is_some());
        self.slot.extra.store(keep);
    }
}

impl Guard<'_> {
    fn extra_mut(&mut self) -> &mut Extra {
        self.extra.get_or_insert_with(Box::default)
    }

    fn more(&mut self) -> &mut More {
        self.extra_mut().more.get_or_insert_with(Box::default)
    }

    fn more_ref(&self) -> Option<&More> {
        self.extra.as_ref().and_then(|x| x.more.as_deref())
    }

    /// [`More`] if there is one (unlike [`Guard::more`], which makes it).
    fn more_if_any(&mut self) -> Option<&mut More> {
        self.extra.as_mut().and_then(|x| x.more.as_deref_mut())
    }

    fn status(&self) -> ConnStatus {
        let e = || {
            self.more_ref()
                .and_then(|m| m.error.clone())
                .unwrap_or(ConnectionError::LocallyClosed)
        };
        match self.slot.phase.load(Ordering::Relaxed) {
            CONNECTING => ConnStatus::Connecting,
            ESTABLISHED => ConnStatus::Established,
            CLOSED => ConnStatus::Closed(e()),
            _ => ConnStatus::Gone(e()),
        }
    }

    fn set(&mut self, st: ConnStatus) {
        let (phase, error) = match st {
            ConnStatus::Connecting => (CONNECTING, None),
            ConnStatus::Established => (ESTABLISHED, None),
            ConnStatus::Closed(e) => (CLOSED, Some(e)),
            ConnStatus::Gone(e) => (GONE, Some(e)),
        };
        self.slot.phase.store(phase, Ordering::Relaxed);
        if error.is_some() || self.more_ref().is_some() {
            self.more().error = error;
        }
    }

    fn rep(&self) -> Option<RepInfo> {
        let fixed = self.extra.as_ref()?.rep.as_ref()?;
        let pd = self.more_ref().map_or(&[][..], |m| &m.private_data[..]);
        Some(unpack_rep(fixed, pd))
    }

    /// Takes every waker out (to be woken once the lock is released).
    fn take_wakers(&mut self) -> Vec<(u64, Waker)> {
        self.more_if_any()
            .map(|m| std::mem::take(&mut m.wakers))
            .unwrap_or_default()
    }

    /// Registers waiter `token`'s waker (replacing the one it registered before).
    fn register(&mut self, token: u64, waker: &Waker) {
        let wakers = &mut self.more().wakers;
        match wakers.iter_mut().find(|(t, _)| *t == token) {
            Some((_, w)) => w.clone_from(waker),
            None => wakers.push((token, waker.clone())),
        }
    }
}

fn wake(wakers: Vec<(u64, Waker)>) {
    for (_, w) in wakers {
        w.wake();
    }
}

/// Takes waiter `token`'s waker out of `slot` when the waiting future ends or is dropped.
struct Waiter<'a> {
    slot: &'a Slot,
    token: u64,
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        let mut g = self.slot.lock();
        if let Some(m) = g.more_if_any() {
            m.wakers.retain(|(t, _)| *t != self.token);
        }
    }
}

impl Slot {
    /// A connection being set up.
    pub(crate) fn new(id: ConnId) -> SlotRef {
        triomphe::Arc::new(Slot {
            extra: AtomicCell::new(None),
            id,
            phase: AtomicU8::new(CONNECTING),
        })
    }

    /// The connection's ID.
    pub(crate) fn id(&self) -> ConnId {
        self.id
    }

    fn lock(&self) -> Guard<'_> {
        // Nothing panics while holding a lock (a poisoned one still guards nothing but `()`).
        #[allow(clippy::indexing_slicing)] // In range: the index is taken modulo the length.
        let lock = &LOCKS[self.id.0 as usize % STRIPES];
        let guard = lock.lock().unwrap_or_else(|e| e.into_inner());
        let extra = self.extra.take();
        Guard {
            slot: self,
            extra,
            _lock: guard,
        }
    }

    /// The current status.
    pub(crate) fn status(&self) -> ConnStatus {
        self.lock().status()
    }

    /// Sets the status and wakes every waiter.
    pub(crate) fn set(&self, status: ConnStatus) {
        let wakers = {
            let mut g = self.lock();
            g.set(status);
            g.take_wakers()
        };
        wake(wakers);
    }

    /// Sets the status computed from the current one, and wakes every waiter.
    pub(crate) fn update(&self, f: impl FnOnce(&ConnStatus) -> ConnStatus) {
        let wakers = {
            let mut g = self.lock();
            let st = f(&g.status());
            g.set(st);
            g.take_wakers()
        };
        wake(wakers);
    }

    /// Keeps the REP the active side received, and wakes every waiter
    /// ([`Slot::wait_rep`]).
    pub(crate) fn set_rep(&self, rep: &RepInfo) {
        let wakers = {
            let mut g = self.lock();
            g.extra_mut().rep = Some(pack_rep(rep));
            let pd = rep.rep.private_data.trimmed();
            if !pd.is_empty() || g.more_ref().is_some() {
                g.more().private_data = pd.into();
            }
            g.take_wakers()
        };
        wake(wakers);
    }

    /// Forgets the REP (the connection left the table).
    pub(crate) fn clear_rep(&self) {
        let mut g = self.lock();
        if let Some(x) = g.extra.as_mut() {
            x.rep = None;
        }
        if let Some(m) = g.more_if_any() {
            m.private_data = Box::default();
        }
    }

    /// The REP, as received.
    pub(crate) fn rep(&self) -> Option<RepInfo> {
        self.lock().rep()
    }

    /// Waits until the REP has arrived (`Ok`, the REP) or the connection has closed without
    /// one (`Err`, why).
    pub(crate) async fn wait_rep(&self) -> Result<RepInfo, ConnectionError> {
        self.wait_guarded(|g| {
            if let Some(rep) = g.rep() {
                return Some(Ok(rep));
            }
            match g.status() {
                ConnStatus::Closed(e) | ConnStatus::Gone(e) => Some(Err(e)),
                // Established without a REP kept: an app consumed the event.
                ConnStatus::Established => Some(Err(ConnectionError::LocallyClosed)),
                ConnStatus::Connecting => None,
            }
        })
        .await
    }

    /// Waits until `f` returns `Some` for the status.
    pub(crate) async fn wait<R>(&self, mut f: impl FnMut(&ConnStatus) -> Option<R>) -> R {
        self.wait_guarded(|g| f(&g.status())).await
    }

    /// Waits until `f` returns `Some`; it sees the slot under its lock, so a change between
    /// its check and the waker's registration cannot be missed.
    async fn wait_guarded<R>(&self, mut f: impl FnMut(&Guard<'_>) -> Option<R>) -> R {
        let waiter = Waiter {
            slot: self,
            token: NEXT_WAITER.fetch_add(1, Ordering::Relaxed),
        };
        poll_fn(|cx| {
            let mut g = self.lock();
            if let Some(r) = f(&g) {
                return Poll::Ready(r);
            }
            g.register(waiter.token, cx.waker());
            Poll::Pending
        })
        .await
    }
}

/// Bytes of a packed REP ([`pack_rep`]).
const REP_LEN: usize = 40;

/// The REP's fields but its private data, as on the wire (bytes 0–35 of its body), then the
/// remote QPN to use (bytes 36–38) and the Failover Accepted code (byte 39, whole).
fn pack_rep(i: &RepInfo) -> [u8; REP_LEN] {
    let r = &i.rep;
    let mut b = [0u8; REP_LEN];
    let [_, ece_hi, ece_mid, ece_lo] = r.ece_vendor_id.get().to_be_bytes();
    let u24 = |v: u32| {
        let [_, x, y, z] = v.to_be_bytes();
        [x, y, z]
    };
    let parts: [&[u8]; 16] = [
        &r.local_comm_id.0.to_be_bytes(),
        &r.remote_comm_id.0.to_be_bytes(),
        &r.local_qkey.0.to_be_bytes(),
        &u24(r.local_qpn.get()),
        &[ece_hi],
        &u24(r.local_eecn.get()),
        &[ece_mid],
        &u24(r.starting_psn.get()),
        &[ece_lo],
        &[r.responder_resources, r.initiator_depth],
        &[(r.target_ack_delay.get() << 3) | u8::from(r.end_to_end_flow_control)],
        &[(r.rnr_retry_count.get() << 5) | (u8::from(r.srq) << 4)],
        &r.local_ca_guid.0.to_be_bytes(),
        &u24(i.remote_qpn.get()),
        &[r.failover_accepted.raw()],
        &[],
    ];
    let mut at = 0;
    for p in parts {
        if let Some(dst) = b.get_mut(at..at + p.len()) {
            dst.copy_from_slice(p);
        }
        at += p.len();
    }
    b
}

fn unpack_rep(b: &[u8; REP_LEN], private_data: &[u8]) -> RepInfo {
    let u32_at = |o: usize| {
        let mut x = [0u8; 4];
        if let Some(s) = b.get(o..o + 4) {
            x.copy_from_slice(s);
        }
        u32::from_be_bytes(x)
    };
    let at = |o: usize| b.get(o).copied().unwrap_or(0);
    let u24_at = |o: usize| u32::from_be_bytes([0, at(o), at(o + 1), at(o + 2)]);
    let mut guid = [0u8; 8];
    if let Some(s) = b.get(28..36) {
        guid.copy_from_slice(s);
    }
    RepInfo {
        rep: Rep {
            local_comm_id: CommId(u32_at(0)),
            remote_comm_id: CommId(u32_at(4)),
            local_qkey: Qkey(u32_at(8)),
            local_qpn: Qpn::masked(u24_at(12)),
            ece_vendor_id: VendorId::masked(u32::from_be_bytes([0, at(15), at(19), at(23)])),
            local_eecn: Eecn::masked(u24_at(16)),
            starting_psn: Psn::masked(u24_at(20)),
            responder_resources: at(24),
            initiator_depth: at(25),
            target_ack_delay: TimeoutExp::masked(at(26) >> 3),
            failover_accepted: FailoverAccepted::from_raw(at(39)),
            end_to_end_flow_control: at(26) & 0x01 != 0,
            rnr_retry_count: U3::masked(at(27) >> 5),
            srq: at(27) & 0x10 != 0,
            local_ca_guid: Guid(u64::from_be_bytes(guid)),
            private_data: PrivateData::from_slice(private_data).unwrap_or_default(),
        },
        remote_qpn: Qpn::masked(u24_at(36)),
    }
}

/// The registry the handles read: connection ID → its [`Slot`] (status, REP), written by the
/// driver only, removed when the connection leaves the table. Cloning it shares it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Registry {
    inner: Arc<Mutex<Table>>,
}

#[derive(Debug, Default)]
struct Table {
    slots: HashTable<SlotRef>,
    hasher: foldhash::fast::RandomState,
}

impl Table {
    fn hash(&self, id: ConnId) -> u64 {
        self.hasher.hash_one(id.0)
    }
}

impl Registry {
    fn table(&self) -> MutexGuard<'_, Table> {
        // Nothing panics while holding the lock; a poisoned one still holds a whole table.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds `slot` under its ID, replacing the slot there.
    pub(crate) fn insert(&self, slot: SlotRef) {
        let mut t = self.table();
        let id = slot.id;
        let hash = t.hash(id);
        let Table { slots, hasher } = &mut *t;
        match slots.find_mut(hash, |s| s.id == id) {
            Some(old) => *old = slot,
            None => {
                slots.insert_unique(hash, slot, |s| hasher.hash_one(s.id.0));
            }
        }
    }

    /// The slot of `id`.
    pub(crate) fn get(&self, id: ConnId) -> Option<SlotRef> {
        let t = self.table();
        t.slots.find(t.hash(id), |s| s.id == id).cloned()
    }

    /// Whether `id` has a slot.
    pub(crate) fn contains(&self, id: ConnId) -> bool {
        let t = self.table();
        t.slots.find(t.hash(id), |s| s.id == id).is_some()
    }

    /// Takes the slot of `id` out.
    pub(crate) fn remove(&self, id: ConnId) -> Option<SlotRef> {
        let mut t = self.table();
        let hash = t.hash(id);
        let e = t.slots.find_entry(hash, |s| s.id == id).ok()?;
        Some(e.remove().0)
    }

    /// Takes every slot out.
    pub(crate) fn drain(&self) -> Vec<SlotRef> {
        self.table().slots.drain().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_rep_round_trips() {
        let mut rep = Rep {
            local_comm_id: CommId(7),
            remote_comm_id: CommId(0xdead_beef),
            local_qkey: Qkey(0x1234_5678),
            local_qpn: Qpn::masked(0x1234),
            ece_vendor_id: VendorId::masked(0xab_cdef),
            local_eecn: Eecn::masked(0x77_6655),
            starting_psn: Psn::masked(0xabcdef),
            responder_resources: 9,
            initiator_depth: 3,
            target_ack_delay: TimeoutExp::masked(17),
            failover_accepted: FailoverAccepted::from_raw(2),
            end_to_end_flow_control: true,
            rnr_retry_count: U3::masked(5),
            local_ca_guid: Guid(0x0102_0304_0506_0708),
            srq: true,
            ..Rep::default()
        };
        rep.private_data.0[..3].copy_from_slice(&[1, 0, 2]);
        let info = RepInfo {
            rep,
            remote_qpn: Qpn::masked(0x55),
        };
        let s = Slot::new(CommId(0xdead_beef));
        s.set_rep(&info);
        assert_eq!(s.rep(), Some(info.clone()));
        s.clear_rep();
        assert_eq!(s.rep(), None);
        let empty = RepInfo {
            rep: Rep::default(),
            remote_qpn: Qpn::masked(3),
        };
        s.set_rep(&empty);
        assert_eq!(s.rep(), Some(empty));
        assert_eq!(
            unpack_rep(&pack_rep(&info), &[1, 0, 2]),
            info,
            "packed directly"
        );
    }

    #[test]
    fn slot_is_small() {
        // One pointer, the ID and the phase: a 24-byte allocation with the reference count.
        assert_eq!(std::mem::size_of::<Slot>(), 16);
        assert!(std::mem::size_of::<Extra>() <= 56);
        let s = Slot::new(CommId(1));
        s.set(ConnStatus::Established);
        // Established, no REP, nobody waiting: nothing besides the slot.
        assert!(s.extra.take().is_none());
    }

    #[tokio::test]
    async fn waiters_see_every_change() {
        let s = Slot::new(CommId(5));
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

    #[tokio::test]
    async fn a_dropped_waiter_leaves_no_waker() {
        let s = Slot::new(CommId(6));
        {
            let wait = s.wait(|st| matches!(st, ConnStatus::Established).then_some(()));
            tokio::pin!(wait);
            // Polled once: pending, its waker registered.
            assert!(futures_poll_once(wait.as_mut()).await.is_none());
            assert!(s.lock().more_ref().is_some());
        }
        // Dropped: the waker is gone, and with it everything the slot held besides itself.
        assert!(s.extra.take().is_none());
    }

    /// Polls `f` once.
    async fn futures_poll_once<F: std::future::Future + Unpin>(mut f: F) -> Option<F::Output> {
        poll_fn(|cx| match std::pin::Pin::new(&mut f).poll(cx) {
            Poll::Ready(r) => Poll::Ready(Some(r)),
            Poll::Pending => Poll::Ready(None),
        })
        .await
    }

    #[test]
    fn registry_finds_replaces_and_removes() {
        let r = Registry::default();
        for i in 1..=1000u32 {
            r.insert(Slot::new(CommId(i.wrapping_mul(0x9e37_79b9))));
        }
        let id = CommId(7u32.wrapping_mul(0x9e37_79b9));
        assert!(r.contains(id));
        let s = Slot::new(id);
        s.set(ConnStatus::Established);
        r.insert(s);
        assert_eq!(r.get(id).map(|s| s.status()), Some(ConnStatus::Established));
        assert!(r.remove(id).is_some());
        assert!(!r.contains(id) && r.get(id).is_none() && r.remove(id).is_none());
        assert_eq!(r.drain().len(), 999);
        assert!(!r.contains(CommId(0x9e37_79b9)));
    }
}
