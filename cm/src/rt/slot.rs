//! The per-connection state the driver shares with the [`Connection`](super::Connection)
//! handles: the connection's ID, its status (with wake-ups for waiters) and, on the active
//! side, the REP; on the passive side, the RTU's private data.
//!
//! It is the runtime's whole per-connection cost besides the core's table, so it is kept
//! small. A slot is one 24-byte allocation ([`SlotRef`], a reference-counted pointer without a
//! weak count: a 32-byte heap chunk): the ID, the phase of the status in one byte, and one
//! pointer to what a connection has only sometimes ([`Locked`], a 48-byte chunk): the REP's
//! fixed fields packed into 32 bytes (active side; its Remote Communication ID and the remote
//! QPN to use follow from the rest), and, rarer still, behind one more pointer, the REP's
//! private data (or on the passive side the RTU's), the error of a closed connection and the wakers of tasks waiting for a
//! change. An established passive connection nobody waits on has none of it. The pointer is
//! guarded by one of [`STRIPES`] process-wide locks picked by the connection ID (a lock per
//! slot would double its size). A `tokio::sync::watch` channel per connection cost ~400 bytes, a
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

/// How many locks guard the slots' [`Locked`] parts (by connection ID).
const STRIPES: usize = 64;

static LOCKS: [Mutex<()>; STRIPES] = [const { Mutex::new(()) }; STRIPES];

/// Names each waiting future, so that it can take its waker out when dropped.
static NEXT_WAITER: AtomicU64 = AtomicU64::new(1);

/// One connection's shared state.
pub(crate) struct Slot {
    /// Taken out (under the connection's stripe lock) while it is read or changed.
    locked: AtomicCell<Option<Box<Locked>>>,
    id: ConnId,
    /// The status's phase ([`CONNECTING`], [`ESTABLISHED`], [`CLOSED`] or [`GONE`]) in its low
    /// bits ([`PHASE`]), and [`WAS_ESTABLISHED`] once the connection has been established;
    /// written under the stripe lock.
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
/// The bits of `Slot::phase` that hold the phase.
const PHASE: u8 = 3;
/// Set in `Slot::phase` when the status becomes [`ESTABLISHED`], and kept after: whether a
/// closed connection had been established (a `Disconnected` alone does not say so: a
/// connection of [`Endpoint::end_stale`](crate::proto::Endpoint::end_stale) never was).
const WAS_ESTABLISHED: u8 = 4;

/// The part of a slot read and changed only under its stripe lock ([`SlotLock`]): what a
/// connection has only sometimes, 40 bytes, a 48-byte heap chunk.
#[derive(Debug, Default)]
struct Locked {
    /// The REP's fixed fields ([`pack_rep`]); all zero when there is none.
    rep: PackedRep,
    more: Option<Box<More>>,
}

/// What a connection has more rarely still.
#[derive(Debug, Default)]
struct More {
    /// The REP's private data (active side) or the RTU's (passive side), without trailing
    /// zeros (which the message's zero padding restores).
    private_data: Box<[u8]>,
    /// Why a `Closed` or `Gone` connection closed.
    error: Option<ConnectionError>,
    /// The tasks waiting for a change, by waiter.
    wakers: Vec<(u64, Waker)>,
    /// What the packed REP cannot hold, when the REP kept has it (never for a REP the
    /// driver keeps: see [`RepRest`]).
    rep_rest: Option<RepRest>,
}

impl More {
    fn is_empty(&self) -> bool {
        self.private_data.is_empty()
            && self.error.is_none()
            && self.wakers.is_empty()
            && self.rep_rest.is_none()
    }
}

/// A slot's stripe lock, held: the slot's [`Locked`] part, taken out under the lock; put back
/// (and freed when empty) on drop.
struct SlotLock<'a> {
    slot: &'a Slot,
    /// The slot's box, kept (not moved out of it) while the lock is held, so that a lock
    /// costs no allocation; created on the first change that needs it.
    locked: Option<Box<Locked>>,
    _lock: MutexGuard<'static, ()>,
}

impl Drop for SlotLock<'_> {
    fn drop(&mut self) {
        let mut locked = self.locked.take();
        if let Some(x) = locked.as_mut() {
            if x.more.as_deref().is_some_and(More::is_empty) {
                x.more = None;
            }
        }
        let keep = locked.filter(|x| x.rep.is_set() || x.more.is_some());
        self.slot.locked.store(keep);
    }
}

impl SlotLock<'_> {
    fn locked_mut(&mut self) -> &mut Locked {
        self.locked.get_or_insert_with(Box::default)
    }

    fn more(&mut self) -> &mut More {
        self.locked_mut().more.get_or_insert_with(Box::default)
    }

    fn more_ref(&self) -> Option<&More> {
        self.locked.as_ref().and_then(|x| x.more.as_deref())
    }

    /// [`More`] if there is one (unlike [`SlotLock::more`], which makes it).
    fn more_if_any(&mut self) -> Option<&mut More> {
        self.locked.as_mut().and_then(|x| x.more.as_deref_mut())
    }

    fn status(&self) -> ConnStatus {
        let e = || {
            self.more_ref()
                .and_then(|m| m.error.clone())
                .unwrap_or(ConnectionError::LocallyClosed)
        };
        match self.slot.phase.load(Ordering::Relaxed) & PHASE {
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
        let old = self.slot.phase.load(Ordering::Relaxed);
        let was = if phase == ESTABLISHED {
            WAS_ESTABLISHED
        } else {
            old & WAS_ESTABLISHED
        };
        self.slot.phase.store(phase | was, Ordering::Relaxed);
        if error.is_some() || self.more_ref().is_some() {
            self.more().error = error;
        }
    }

    fn rep(&self) -> Option<RepInfo> {
        let fixed = &self.locked.as_ref()?.rep;
        if !fixed.is_set() {
            return None;
        }
        let more = self.more_ref();
        let pd = more.map_or(&[][..], |m| &m.private_data[..]);
        let rest = more.and_then(|m| m.rep_rest);
        Some(unpack_rep(fixed, pd, self.slot.id, rest))
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
            locked: AtomicCell::new(None),
            id,
            phase: AtomicU8::new(CONNECTING),
        })
    }

    /// The connection's ID.
    pub(crate) fn id(&self) -> ConnId {
        self.id
    }

    fn lock(&self) -> SlotLock<'_> {
        // Nothing panics while holding a lock (a poisoned one still guards nothing but `()`).
        #[allow(clippy::indexing_slicing)] // In range: the index is taken modulo the length.
        let lock = &LOCKS[self.id.0 as usize % STRIPES];
        let guard = lock.lock().unwrap_or_else(|e| e.into_inner());
        let locked = self.locked.take();
        SlotLock {
            slot: self,
            locked,
            _lock: guard,
        }
    }

    /// The current status.
    pub(crate) fn status(&self) -> ConnStatus {
        self.lock().status()
    }

    /// Whether the status has been [`ConnStatus::Established`] at some time (it may be closed
    /// since).
    pub(crate) fn was_established(&self) -> bool {
        self.phase.load(Ordering::Relaxed) & WAS_ESTABLISHED != 0
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
            let (packed, rest) = pack_rep(rep, self.id);
            g.locked_mut().rep = packed;
            let pd = rep.rep.private_data.trimmed();
            if !pd.is_empty() || rest.is_some() || g.more_ref().is_some() {
                let m = g.more();
                m.private_data = pd.into();
                m.rep_rest = rest;
            }
            g.take_wakers()
        };
        wake(wakers);
    }

    /// Keeps the private data of the RTU the passive side received (trailing zeros trimmed).
    pub(crate) fn set_rtu_private_data(&self, private_data: &[u8]) {
        let mut g = self.lock();
        if g.locked.as_ref().is_some_and(|x| x.rep.is_set()) {
            // An active connection: its slot holds the REP's.
            return;
        }
        if !private_data.is_empty() || g.more_ref().is_some() {
            g.more().private_data = private_data.into();
        }
    }

    /// The private data of the RTU the passive side received (empty when it had none, on the
    /// active side, and once the connection has left the table).
    pub(crate) fn rtu_private_data(&self) -> Vec<u8> {
        let g = self.lock();
        if g.locked.as_ref().is_some_and(|x| x.rep.is_set()) {
            return Vec::new();
        }
        g.more_ref()
            .map_or_else(Vec::new, |m| m.private_data.to_vec())
    }

    /// Forgets the REP (the connection left the table).
    pub(crate) fn clear_rep(&self) {
        let mut g = self.lock();
        if let Some(x) = g.locked.as_mut() {
            x.rep = PackedRep::default();
        }
        if let Some(m) = g.more_if_any() {
            m.private_data = Box::default();
            m.rep_rest = None;
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
    async fn wait_guarded<R>(&self, mut f: impl FnMut(&SlotLock<'_>) -> Option<R>) -> R {
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
const REP_LEN: usize = 32;

/// The packed REP's byte that holds, besides the RNR Retry Count (bits 7–5) and SRQ (bit 4),
/// the Failover Accepted code (bits 3–2) and two flags.
const FLAGS: usize = 23;
/// A REP is kept (a packed REP of all zeros is none).
const KEPT: u8 = 0x01;
/// The remote QPN to use is the REP's XRC TGT QPN (its EECN field), not its Local QPN.
const TGT_QPN: u8 = 0x02;

/// A REP's fixed fields packed into 32 bytes ([`pack_rep`]).
#[derive(Debug, Default, Clone, Copy)]
struct PackedRep([u8; REP_LEN]);

impl PackedRep {
    /// Whether a REP is kept.
    fn is_set(&self) -> bool {
        self.0.get(FLAGS).is_some_and(|f| f & KEPT != 0)
    }
}

/// The fields of a kept REP that its packed form leaves out because they normally follow from
/// the rest: its Remote Communication ID (the connection's own ID), the remote QPN to use (its
/// Local QPN, or its TGT QPN for XRC) and a Failover Accepted code of 2 bits. A REP the driver
/// keeps always fits; any other is kept whole with this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RepRest {
    remote_comm_id: CommId,
    remote_qpn: Qpn,
    failover_accepted: FailoverAccepted,
}

/// Packs a REP the connection `own` received: its fields but the private data, the Remote
/// Communication ID and the remote QPN, as on the wire (bytes 0–3 and 8–35 of its body; the
/// Failover Accepted code, two bits, in byte 23 with the flags), and what does not follow
/// from them ([`RepRest`]).
fn pack_rep(i: &RepInfo, own: ConnId) -> (PackedRep, Option<RepRest>) {
    let r = &i.rep;
    let mut b = [0u8; REP_LEN];
    let [_, ece_hi, ece_mid, ece_lo] = r.ece_vendor_id.get().to_be_bytes();
    let u24 = |v: u32| {
        let [_, x, y, z] = v.to_be_bytes();
        [x, y, z]
    };
    // The remote QPN follows from the REP by the same rule `unpack_rep` applies.
    let tgt = i.remote_qpn != r.local_qpn;
    let failover = r.failover_accepted.raw();
    let fits = r.remote_comm_id == own && i.remote_qpn == r.remote_qpn_for(tgt) && failover <= 3;
    let flags = KEPT | if tgt { TGT_QPN } else { 0 } | (failover & 3) << 2;
    let parts: [&[u8]; 12] = [
        &r.local_comm_id.0.to_be_bytes(),
        &r.local_qkey.0.to_be_bytes(),
        &u24(r.local_qpn.get()),
        &[ece_hi],
        &u24(r.local_eecn.get()),
        &[ece_mid],
        &u24(r.starting_psn.get()),
        &[ece_lo],
        &[r.responder_resources, r.initiator_depth],
        &[(r.target_ack_delay.get() << 3) | u8::from(r.end_to_end_flow_control)],
        &[(r.rnr_retry_count.get() << 5) | (u8::from(r.srq) << 4) | flags],
        &r.local_ca_guid.0.to_be_bytes(),
    ];
    let mut at = 0;
    for p in parts {
        if let Some(dst) = b.get_mut(at..at + p.len()) {
            dst.copy_from_slice(p);
        }
        at += p.len();
    }
    let rest = (!fits).then_some(RepRest {
        remote_comm_id: r.remote_comm_id,
        remote_qpn: i.remote_qpn,
        failover_accepted: r.failover_accepted,
    });
    (PackedRep(b), rest)
}

/// The REP that [`pack_rep`] packed for connection `own`.
fn unpack_rep(p: &PackedRep, private_data: &[u8], own: ConnId, rest: Option<RepRest>) -> RepInfo {
    let b = &p.0;
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
    if let Some(s) = b.get(24..32) {
        guid.copy_from_slice(s);
    }
    let flags = at(FLAGS);
    let mut rep = Rep {
        local_comm_id: CommId(u32_at(0)),
        remote_comm_id: own,
        local_qkey: Qkey(u32_at(4)),
        local_qpn: Qpn::masked(u24_at(8)),
        ece_vendor_id: VendorId::masked(u32::from_be_bytes([0, at(11), at(15), at(19)])),
        local_eecn: Eecn::masked(u24_at(12)),
        starting_psn: Psn::masked(u24_at(16)),
        responder_resources: at(20),
        initiator_depth: at(21),
        target_ack_delay: TimeoutExp::masked(at(22) >> 3),
        failover_accepted: FailoverAccepted::from_raw((flags >> 2) & 3),
        end_to_end_flow_control: at(22) & 0x01 != 0,
        rnr_retry_count: U3::masked(flags >> 5),
        srq: flags & 0x10 != 0,
        local_ca_guid: Guid(u64::from_be_bytes(guid)),
        private_data: PrivateData::from_slice(private_data).unwrap_or_default(),
    };
    let remote_qpn = match rest {
        Some(x) => {
            rep.remote_comm_id = x.remote_comm_id;
            rep.failover_accepted = x.failover_accepted;
            x.remote_qpn
        }
        None => rep.remote_qpn_for(flags & TGT_QPN != 0),
    };
    RepInfo { rep, remote_qpn }
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

    /// Registers the slot of a new connection (being set up), and returns it.
    pub(crate) fn open(&self, id: ConnId) -> SlotRef {
        let slot = Slot::new(id);
        self.insert(slot.clone());
        slot
    }

    /// Registers the slot of a connection established statelessly (its RTU's private data
    /// set, then its status), and returns it.
    pub(crate) fn open_established(&self, id: ConnId, rtu_private_data: &[u8]) -> SlotRef {
        let slot = Slot::new(id);
        slot.set_rtu_private_data(rtu_private_data);
        slot.set(ConnStatus::Established);
        self.insert(slot.clone());
        slot
    }

    /// Takes the slot of `id` out as its connection leaves the table: its REP forgotten, its
    /// status set to what `end` makes of the current one (waking every waiter).
    pub(crate) fn close(&self, id: ConnId, end: impl FnOnce(&ConnStatus) -> ConnStatus) {
        if let Some(slot) = self.remove(id) {
            slot.clear_rep();
            slot.update(end);
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
        let (packed, rest) = pack_rep(&info, CommId(0xdead_beef));
        assert!(
            rest.is_some(),
            "remote QPN 0x55 is neither the Local QPN nor the TGT QPN"
        );
        assert_eq!(
            unpack_rep(&packed, &[1, 0, 2], CommId(0xdead_beef), rest),
            info,
            "packed directly"
        );
        // What the driver keeps fits the packed form alone: the REP to this connection, the
        // remote QPN its Local QPN (RC) or its TGT QPN (XRC).
        for xrc in [false, true] {
            let mut rep = info.rep;
            rep.private_data = Default::default();
            let info = RepInfo {
                remote_qpn: rep.remote_qpn_for(xrc),
                rep,
            };
            let (packed, rest) = pack_rep(&info, CommId(0xdead_beef));
            assert_eq!(rest, None, "xrc {xrc}");
            assert_eq!(unpack_rep(&packed, &[], CommId(0xdead_beef), None), info);
            let s = Slot::new(CommId(0xdead_beef));
            s.set_rep(&info);
            assert_eq!(s.rep(), Some(info));
            // No private data, nobody waiting: the packed REP alone.
            let x = s.locked.take().expect("the REP is kept");
            assert!(x.more.is_none() && x.rep.is_set());
        }
    }

    #[test]
    fn slot_is_small() {
        // One pointer, the ID and the phase: a 24-byte allocation with the reference count.
        assert_eq!(std::mem::size_of::<Slot>(), 16);
        // The packed REP and one pointer: a 48-byte heap chunk (56 would take 64).
        assert_eq!(std::mem::size_of::<Locked>(), 40);
        let s = Slot::new(CommId(1));
        s.set(ConnStatus::Established);
        // Established, no REP, nobody waiting: nothing besides the slot.
        assert!(s.locked.take().is_none());
    }

    #[test]
    fn a_closed_slot_remembers_whether_it_was_established() {
        let e = ConnectionError::DisconnectTimedOut;
        let never = Slot::new(CommId(1));
        never.set(ConnStatus::Closed(e.clone()));
        never.set(ConnStatus::Gone(e.clone()));
        assert!(!never.was_established());
        let was = Slot::new(CommId(2));
        assert!(!was.was_established());
        was.set(ConnStatus::Established);
        was.set(ConnStatus::Closed(e.clone()));
        assert_eq!(was.status(), ConnStatus::Closed(e.clone()));
        was.update(|_| ConnStatus::Gone(e.clone()));
        assert_eq!(was.status(), ConnStatus::Gone(e));
        assert!(was.was_established());
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
        assert!(s.locked.take().is_none());
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
