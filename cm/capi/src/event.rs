//! The event channel: a queue of [`Event`]s, a condition variable for the blocking wait, and
//! a socket pair whose read end is the pollable fd (`ibcm_get_fd`). The fd is readable
//! exactly while the queue is not empty: one byte is written when the queue becomes non-empty
//! and read back when it becomes empty, both under the queue's lock.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ibcm::proto::ConnectionError;
use ibcm_mad::xrc::TargetGone;
use ibcm_mad::{RejReason, Rep, Req};

use crate::ffi::types::ibcm_event_type::{self, *};
use crate::ffi::types::ibcm_status::{self, *};
use crate::ffi::types::ibcm_xrc_report::{self, *};

/// One event, owned by Rust (the FFI layer lends a C view of it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Event {
    pub(crate) kind: ibcm_event_type,
    pub(crate) status: ibcm_status,
    pub(crate) conn: u64,
    pub(crate) comm_id: u32,
    pub(crate) transport: u32,
    pub(crate) service_id: u64,
    pub(crate) remote_qpn: u32,
    pub(crate) remote_psn: u32,
    pub(crate) rej_reason: u16,
    pub(crate) by_peer: bool,
    pub(crate) target_gone: bool,
    pub(crate) xrc_report: ibcm_xrc_report,
    pub(crate) peer: String,
    pub(crate) reason: String,
    pub(crate) private_data: Vec<u8>,
    /// The handle's context pointer (0: none).
    pub(crate) context: usize,
    /// A request with an rdma_cm CMA header: its source and destination, "IP:PORT".
    pub(crate) rdma_cm: Option<(String, String)>,
    /// SIDR_REPLY: the status (IBTA table 119).
    pub(crate) sidr_status: u32,
    /// SIDR_REPLY: the Q_Key.
    pub(crate) qkey: u32,
    /// LAP: the proposed path (this side's view).
    pub(crate) path: Option<crate::ffi::types::ibcm_path>,
    /// APR: the status.
    pub(crate) apr_status: u32,
    /// APR: the additional information.
    pub(crate) additional_info: Vec<u8>,
    /// LAP: which LAP of the connection this event is (its acknowledgement rejects that one
    /// only, if still unanswered).
    pub(crate) lap_serial: u64,
    /// CONNECT_REQUEST: the REQ's connection parameters; CONNECT_RESPONSE and the active
    /// side's ESTABLISHED: the REP's; all 0 otherwise.
    pub(crate) conn_param: ConnParam,
}

/// The connection parameters a REQ or a REP carries, as the receiver sees them: what the
/// kernel's ib_cm reports (`cm_format_req_event`, `cm_format_rep_event`) and rdma_cm passes
/// on in `event.param.conn`. The sender's initiator depth is the receiver's responder
/// resources and the other way round.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ConnParam {
    /// The RDMA reads and atomics the peer may have outstanding at this side: the message's
    /// Initiator Depth.
    pub(crate) responder_resources: u8,
    /// The RDMA reads and atomics the peer can answer at once: the message's Responder
    /// Resources.
    pub(crate) initiator_depth: u8,
    /// End-to-End Flow Control.
    pub(crate) flow_control: bool,
    /// Retry Count (a REQ's; a REP has none: 0).
    pub(crate) retry_count: u8,
    /// RNR Retry Count.
    pub(crate) rnr_retry_count: u8,
    /// SRQ.
    pub(crate) srq: bool,
    /// Path Packet Payload MTU as `enum ibv_mtu` (a REQ's; a REP has none: 0).
    pub(crate) path_mtu: u8,
}

impl ConnParam {
    /// A received REQ's.
    pub(crate) fn of_req(req: &Req) -> Self {
        ConnParam {
            responder_resources: req.initiator_depth,
            initiator_depth: req.responder_resources,
            flow_control: req.end_to_end_flow_control,
            retry_count: req.retry_count.get(),
            rnr_retry_count: req.rnr_retry_count.get(),
            srq: req.srq,
            path_mtu: req.path_mtu.raw(),
        }
    }

    /// A received REP's.
    pub(crate) fn of_rep(rep: &Rep) -> Self {
        ConnParam {
            responder_resources: rep.initiator_depth,
            initiator_depth: rep.responder_resources,
            flow_control: rep.end_to_end_flow_control,
            retry_count: 0,
            rnr_retry_count: rep.rnr_retry_count.get(),
            srq: rep.srq,
            path_mtu: 0,
        }
    }
}

/// Whether an event of `kind` is a connection's last (after it is acknowledged, the handle
/// is unknown).
pub(crate) fn is_final(kind: ibcm_event_type) -> bool {
    matches!(
        kind,
        IBCM_EVENT_REJECTED
            | IBCM_EVENT_UNREACHABLE
            | IBCM_EVENT_CONNECT_ERROR
            | IBCM_EVENT_DISCONNECTED
            | IBCM_EVENT_SIDR_REPLY
    )
}

impl Event {
    pub(crate) fn new(kind: ibcm_event_type, conn: u64) -> Self {
        Event {
            kind,
            status: IBCM_OK,
            conn,
            comm_id: 0,
            transport: 0,
            service_id: 0,
            remote_qpn: 0,
            remote_psn: 0,
            rej_reason: 0,
            by_peer: false,
            target_gone: false,
            xrc_report: IBCM_XRC_NONE,
            peer: String::new(),
            reason: String::new(),
            private_data: Vec::new(),
            context: 0,
            rdma_cm: None,
            sidr_status: 0,
            qkey: 0,
            path: None,
            apr_status: 0,
            additional_info: Vec::new(),
            lap_serial: 0,
            conn_param: ConnParam::default(),
        }
    }

    /// Whether this is a connection's last event.
    #[cfg(test)]
    pub(crate) fn is_final(&self) -> bool {
        is_final(self.kind)
    }

    /// The final event of connection `conn` that ended with `why`; `established`: whether it
    /// had been established (then it is `DISCONNECTED` whatever the cause).
    pub(crate) fn ended(conn: u64, comm_id: u32, established: bool, why: &ConnectionError) -> Self {
        let kind = match why {
            _ if established => IBCM_EVENT_DISCONNECTED,
            ConnectionError::Disconnected { .. } | ConnectionError::DisconnectTimedOut => {
                IBCM_EVENT_DISCONNECTED
            }
            ConnectionError::Rejected { .. } => IBCM_EVENT_REJECTED,
            ConnectionError::TimedOut => IBCM_EVENT_UNREACHABLE,
            _ => IBCM_EVENT_CONNECT_ERROR,
        };
        let mut ev = Event::new(kind, conn);
        ev.comm_id = comm_id;
        // A disconnect (a DREQ either way, or ours unanswered) is no failure: `IBCM_OK`.
        ev.status = match why {
            ConnectionError::Disconnected { .. } | ConnectionError::DisconnectTimedOut => IBCM_OK,
            _ => IBCM_ECLOSED,
        };
        ev.reason = why.to_string();
        match why {
            ConnectionError::Disconnected {
                by_peer,
                private_data,
            } => {
                ev.by_peer = *by_peer;
                ev.private_data.clone_from(private_data);
                if let Some(tg) = TargetGone::parse(private_data) {
                    ev.target_gone = true;
                    ev.reason = tg.kind.to_string();
                }
            }
            ConnectionError::Rejected {
                reason,
                ari,
                private_data,
            } => {
                ev.rej_reason = reason.raw();
                ev.private_data.clone_from(private_data);
                if *reason == RejReason::NoResources {
                    // REJ 3 names no limit: say which ones an ibcmd peer refuses at.
                    ev.reason = format!(
                        "{why}: the peer's CM has no room for it (an ibcmd peer refuses at its \
                         admission limits: --max-half-open-per-peer, default 1024 unanswered \
                         REQs from one host; --max-established-per-peer, 65536; \
                         --max-established)"
                    );
                }
                if let Some(tg) = TargetGone::parse(ari).or_else(|| TargetGone::parse(private_data))
                {
                    ev.target_gone = true;
                    ev.reason = format!("{} ({why})", tg.kind);
                }
            }
            ConnectionError::LocallyRejected { reason } => ev.rej_reason = reason.raw(),
            // What the client reports for every connection when the daemon goes away.
            ConnectionError::LocallyClosed if established => {
                ev.status = IBCM_EGONE;
                ev.reason = "ended here: the node service connection is gone".into();
            }
            _ => {}
        }
        ev
    }

    /// A keeper event for this client (`{"event":"qp-gone","qpn":N,"cause":…}`) as an
    /// `XRC_REPORT` (`IBCM_XRC_QP_GONE`); `None` for other events.
    pub(crate) fn keeper(v: &serde_json::Value) -> Option<Self> {
        if v.get("event").and_then(serde_json::Value::as_str) != Some("qp-gone") {
            return None;
        }
        let qpn = v
            .get("qpn")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0);
        let cause = v
            .get("cause")
            .and_then(serde_json::Value::as_str)
            .unwrap_or("");
        let mut ev = Event::new(IBCM_EVENT_XRC_REPORT, 0);
        ev.xrc_report = IBCM_XRC_QP_GONE;
        ev.remote_qpn = u32::try_from(qpn).unwrap_or(0);
        ev.reason = format!("qp-gone qpn={qpn} cause={cause}");
        Some(ev)
    }

    /// An XRC report line of the daemon (its first word says which kind).
    pub(crate) fn xrc(line: String) -> Self {
        let mut ev = Event::new(IBCM_EVENT_XRC_REPORT, 0);
        ev.xrc_report = match line.split_whitespace().next() {
            Some("accepted") => IBCM_XRC_ACCEPTED,
            Some("rejected") => IBCM_XRC_REJECTED,
            Some("established") => IBCM_XRC_ESTABLISHED,
            Some("teardown") => IBCM_XRC_TEARDOWN,
            Some("closed") => IBCM_XRC_CLOSED,
            _ => IBCM_XRC_OTHER,
        };
        ev.reason = line;
        ev
    }
}

/// The queue, and whether it is closed (the node service connection is gone).
#[derive(Debug, Default)]
struct Queue {
    events: VecDeque<Event>,
    /// No event is queued any more: once the queue is empty, takers get [`Gone`] at once
    /// and the fd stays readable.
    closed: bool,
}

/// A taker found the queue empty and closed: the node service connection is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Gone;

/// The queue and its fd.
#[derive(Debug)]
pub(crate) struct Channel {
    queue: Mutex<Queue>,
    ready: Condvar,
    rd: UnixStream,
    wr: UnixStream,
}

impl Channel {
    pub(crate) fn new() -> std::io::Result<Self> {
        let (rd, wr) = UnixStream::pair()?;
        rd.set_nonblocking(true)?;
        wr.set_nonblocking(true)?;
        Ok(Channel {
            queue: Mutex::new(Queue::default()),
            ready: Condvar::new(),
            rd,
            wr,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The fd that is readable while events are queued (and for ever once closed).
    pub(crate) fn fd(&self) -> RawFd {
        self.rd.as_raw_fd()
    }

    /// Queues `ev`; after [`Channel::close`] it is dropped.
    pub(crate) fn push(&self, ev: Event) {
        let mut q = self.lock();
        if q.closed {
            return;
        }
        if q.events.is_empty() {
            // One byte in the pair while the queue is non-empty; the pair holds far more.
            let _ = (&self.wr).write(&[1]);
        }
        q.events.push_back(ev);
        self.ready.notify_one();
    }

    /// Closes the queue: the events queued are still taken, then every take (a waiting one
    /// too) finds [`Gone`] at once, and the fd stays readable so that a poll loop comes to
    /// take it.
    pub(crate) fn close(&self) {
        let mut q = self.lock();
        if q.closed {
            return;
        }
        q.closed = true;
        if q.events.is_empty() {
            let _ = (&self.wr).write(&[1]);
        }
        self.ready.notify_all();
    }

    /// Whether the queue is closed (it may still hold events).
    pub(crate) fn is_closed(&self) -> bool {
        self.lock().closed
    }

    fn take(&self, q: &mut Queue) -> Result<Option<Event>, Gone> {
        let Some(ev) = q.events.pop_front() else {
            return if q.closed { Err(Gone) } else { Ok(None) };
        };
        if q.events.is_empty() && !q.closed {
            let mut b = [0u8; 8];
            let _ = (&self.rd).read(&mut b);
        }
        Ok(Some(ev))
    }

    /// The next event, without waiting.
    pub(crate) fn try_pop(&self) -> Result<Option<Event>, Gone> {
        let mut q = self.lock();
        self.take(&mut q)
    }

    /// The next event, waiting up to `timeout` (`None`: for ever); [`Gone`] at once when the
    /// queue is empty and closed, or becomes closed while waiting.
    pub(crate) fn wait(&self, timeout: Option<Duration>) -> Result<Option<Event>, Gone> {
        let end = timeout.map(|t| Instant::now() + t);
        let mut q = self.lock();
        loop {
            if let Some(ev) = self.take(&mut q)? {
                return Ok(Some(ev));
            }
            q = match end {
                None => self.ready.wait(q).unwrap_or_else(|e| e.into_inner()),
                Some(end) => {
                    let left = end.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(None);
                    }
                    self.ready
                        .wait_timeout(q, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ibcm_mad::xrc::{GoneCause, RejectKind};

    /// Whether the fd is readable (test only: reads the byte and puts it back).
    fn readable(c: &Channel) -> bool {
        let mut b = [0u8; 8];
        match (&c.rd).read(&mut b) {
            Ok(n) => {
                assert_eq!(n, 1, "one byte while events are queued");
                (&c.wr).write_all(&b[..1]).unwrap();
                true
            }
            Err(e) => {
                assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
                false
            }
        }
    }

    #[test]
    fn fd_is_readable_exactly_while_events_are_queued() {
        let c = Channel::new().unwrap();
        assert!(!readable(&c));
        assert_eq!(c.try_pop(), Ok(None));
        c.push(Event::new(IBCM_EVENT_ESTABLISHED, 1));
        c.push(Event::new(IBCM_EVENT_ESTABLISHED, 2));
        assert!(readable(&c));
        assert_eq!(c.try_pop().unwrap().map(|e| e.conn), Some(1));
        assert!(readable(&c));
        assert_eq!(
            c.wait(Some(Duration::ZERO)).unwrap().map(|e| e.conn),
            Some(2)
        );
        assert!(!readable(&c));
        assert_eq!(c.wait(Some(Duration::from_millis(1))), Ok(None));
    }

    #[test]
    fn a_closed_queue_gives_its_events_then_gone_to_every_taker() {
        let c = std::sync::Arc::new(Channel::new().unwrap());
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let c = c.clone();
                std::thread::spawn(move || c.wait(None).map(|e| e.map(|e| e.conn)))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(20));
        c.push(Event::new(IBCM_EVENT_SERVICE_GONE, 0));
        c.close();
        let mut got: Vec<_> = waiters.into_iter().map(|t| t.join().unwrap()).collect();
        got.sort();
        assert_eq!(got, [Ok(Some(0)), Err(Gone)]);
        c.push(Event::new(IBCM_EVENT_ESTABLISHED, 5));
        assert_eq!(c.try_pop(), Err(Gone), "nothing is queued after the close");
        assert_eq!(c.wait(None), Err(Gone));
        assert!(readable(&c), "the fd stays readable once closed");
        let c = Channel::new().unwrap();
        c.push(Event::new(IBCM_EVENT_ESTABLISHED, 7));
        c.close();
        assert!(readable(&c));
        assert_eq!(c.try_pop().unwrap().map(|e| e.conn), Some(7));
        assert!(readable(&c));
        assert_eq!(c.wait(Some(Duration::from_secs(5))), Err(Gone));
    }

    #[test]
    fn wait_wakes_on_push_from_another_thread() {
        let c = std::sync::Arc::new(Channel::new().unwrap());
        let c2 = c.clone();
        let t = std::thread::spawn(move || c2.wait(None).unwrap().map(|e| e.conn));
        c.push(Event::new(IBCM_EVENT_ESTABLISHED, 9));
        assert_eq!(t.join().unwrap(), Some(9));
    }

    #[test]
    fn each_event_goes_to_exactly_one_taker() {
        let c = std::sync::Arc::new(Channel::new().unwrap());
        let takers: Vec<_> = (0..4)
            .map(|_| {
                let c = c.clone();
                std::thread::spawn(move || {
                    // Until a stop mark (one per taker).
                    let mut got = Vec::new();
                    while let Ok(Some(e)) = c.wait(None) {
                        if e.conn == u64::MAX {
                            break;
                        }
                        got.push(e.conn);
                    }
                    got
                })
            })
            .collect();
        for n in (0..1000).chain([u64::MAX; 4]) {
            c.push(Event::new(IBCM_EVENT_ESTABLISHED, n));
        }
        let mut all: Vec<u64> = takers.into_iter().flat_map(|t| t.join().unwrap()).collect();
        all.sort_unstable();
        assert_eq!(all, (0..1000).collect::<Vec<_>>());
        assert!(!readable(&c));
    }

    #[test]
    fn final_events_say_why() {
        let tg = TargetGone {
            kind: RejectKind::Gone(GoneCause::CreatorExited),
            qpn: None,
        };
        let why = ConnectionError::Disconnected {
            by_peer: true,
            private_data: tg.to_bytes()[..11].to_vec(),
        };
        let ev = Event::ended(3, 0x10, true, &why);
        assert_eq!((ev.kind, ev.status), (IBCM_EVENT_DISCONNECTED, IBCM_OK));
        assert!(ev.by_peer && ev.target_gone && ev.is_final());
        assert_eq!(ev.reason, "target gone (creator exited)");
        let ev = Event::ended(3, 0x10, false, &ConnectionError::TimedOut);
        assert_eq!((ev.kind, ev.status), (IBCM_EVENT_UNREACHABLE, IBCM_ECLOSED));
        let ev = Event::ended(3, 0x10, true, &ConnectionError::LocallyClosed);
        assert_eq!((ev.kind, ev.status), (IBCM_EVENT_DISCONNECTED, IBCM_EGONE));
        let rej = ConnectionError::Rejected {
            reason: ibcm_mad::RejReason::ConsumerReject,
            ari: Vec::new(),
            private_data: vec![1, 2],
        };
        let ev = Event::ended(3, 0x10, false, &rej);
        assert_eq!(
            (ev.kind, ev.rej_reason, ev.target_gone),
            (IBCM_EVENT_REJECTED, 28, false)
        );
        assert_eq!(ev.private_data, [1, 2]);
        let full = ConnectionError::Rejected {
            reason: RejReason::NoResources,
            ari: Vec::new(),
            private_data: Vec::new(),
        };
        let ev = Event::ended(3, 0x10, false, &full);
        assert_eq!((ev.kind, ev.rej_reason), (IBCM_EVENT_REJECTED, 3));
        assert!(
            ev.reason.contains("--max-half-open-per-peer"),
            "{}",
            ev.reason
        );
        let ev = Event::xrc("established conn=0x1 tgt_qpn=0x48".into());
        assert_eq!(ev.xrc_report, IBCM_XRC_ESTABLISHED);
        assert!(!ev.is_final());
    }

    #[test]
    fn conn_params_are_the_receivers_view_of_the_req_and_rep() {
        use ibcm_mad::{Mtu, U3};
        let req = Req {
            responder_resources: 4,
            initiator_depth: 2,
            end_to_end_flow_control: true,
            retry_count: U3::masked(5),
            rnr_retry_count: U3::masked(6),
            srq: true,
            path_mtu: Mtu::Mtu2048,
            ..Req::default()
        };
        // The initiator's depth is the receiver's responder resources, and the other way
        // round (the kernel's cm_format_req_event).
        assert_eq!(
            ConnParam::of_req(&req),
            ConnParam {
                responder_resources: 2,
                initiator_depth: 4,
                flow_control: true,
                retry_count: 5,
                rnr_retry_count: 6,
                srq: true,
                path_mtu: 4,
            }
        );
        let rep = Rep {
            responder_resources: 8,
            initiator_depth: 3,
            end_to_end_flow_control: false,
            rnr_retry_count: U3::masked(1),
            srq: true,
            ..Rep::default()
        };
        // So for a REP too (cm_format_rep_event); it has no retry count and no MTU.
        assert_eq!(
            ConnParam::of_rep(&rep),
            ConnParam {
                responder_resources: 3,
                initiator_depth: 8,
                flow_control: false,
                retry_count: 0,
                rnr_retry_count: 1,
                srq: true,
                path_mtu: 0,
            }
        );
        assert_eq!(
            Event::new(IBCM_EVENT_ESTABLISHED, 1).conn_param,
            ConnParam::default()
        );
    }
}
