//! A connection's QP and CQ as the data protocols (`rping`, `ucmatose`) use them; `verbs`
//! creates them and brings them up.

use std::collections::VecDeque;

use anyhow::{anyhow, bail, Context, Result};
use ibcm::proto::ConnectionError;
use ibcm::rt::Connection;
use ibcm_xrc::verbs::rc::{Completion, CompletionOp, CompletionQueue, CqEvents, Device, RcQp};

/// A CQ waited on through its completion channel.
pub(super) struct Cq {
    events: CqEvents,
    pub(super) cq: CompletionQueue,
    pending: VecDeque<Completion>,
}

impl Cq {
    pub(super) fn new(dev: &Device, cqe: u32) -> Result<Self> {
        let cq = CompletionQueue::new(dev, cqe)?;
        let events = CqEvents::new(&cq).context("completion channel")?;
        Ok(Cq {
            events,
            cq,
            pending: VecDeque::new(),
        })
    }

    /// The next completion: polled first; when the CQ is empty, waits for the armed CQ's
    /// event, takes it, re-arms and polls again (so none that arrives meanwhile is missed).
    pub(super) async fn next(&mut self) -> Result<Completion> {
        loop {
            if let Some(c) = self.pending.pop_front() {
                return Ok(c);
            }
            let mut got = Vec::new();
            self.cq.poll(&mut got)?;
            if !got.is_empty() {
                self.pending.extend(got);
                continue;
            }
            self.events.wait().await?;
        }
    }

    /// Waits until every op of `want` has completed once, skipping SEND completions not asked
    /// for; returns the completions in `want`'s order. A failed completion is an error.
    pub(super) async fn wait(&mut self, want: &[CompletionOp]) -> Result<Vec<Completion>> {
        let mut slots: Vec<Option<Completion>> = vec![None; want.len()];
        while slots.iter().any(Option::is_none) {
            let c = self.next().await?;
            let Some(op) = c.op else {
                bail!(
                    "work request {} failed: status {} (vendor error {:#x})",
                    c.wr_id,
                    c.status,
                    c.vendor_err
                );
            };
            match want
                .iter()
                .zip(slots.iter_mut())
                .find(|(w, s)| **w == op && s.is_none())
            {
                Some((_, s)) => *s = Some(c),
                None if op == CompletionOp::Send => {}
                None => bail!("unexpected {op:?} completion (wr {})", c.wr_id),
            }
        }
        Ok(slots.into_iter().flatten().collect())
    }
}

/// A connection's QP and CQ.
pub(super) struct ConnQp {
    pub(super) qp: RcQp,
    pub(super) cq: Option<Cq>,
    pub(super) dev: Device,
}

impl ConnQp {
    /// The connection's own CQ (every data protocol has one).
    pub(super) fn cq(&mut self) -> Result<&mut Cq> {
        self.cq
            .as_mut()
            .ok_or_else(|| anyhow!("this QP has no completion channel (--data none)"))
    }
}

/// Waits for `fut` unless the connection ends first (then an error naming why).
pub(super) async fn or_closed<T>(
    conn: &Connection,
    fut: impl std::future::Future<Output = Result<T>>,
) -> Result<Result<T, ConnectionError>> {
    tokio::select! {
        r = fut => r.map(Ok),
        why = conn.closed() => Ok(Err(why)),
    }
}
