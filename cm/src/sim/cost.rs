//! A CM processing-cost model per node: one FIFO server per node.
//!
//! Without a cost a node handles every MAD the instant it arrives. With a [`CmCost`] every MAD
//! the node receives or sends is a job of `per_mad` on one server that works in arrival order:
//! a received MAD reaches the endpoint when its job finishes, a sent MAD leaves when its job
//! finishes. A node may instead *mirror* another node's server ([`CmCost::mirror`]): its jobs
//! wait behind that node's backlog at the same instant but add nothing to it. That is how a
//! per-node model of a symmetric all-to-all exchange loads the modelled peers exactly as the
//! node simulated in full is loaded, without simulating the peers' other traffic.

use std::time::{Duration, Instant};

/// The processing cost of one node's CM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmCost {
    /// Time one MAD (received or sent) occupies the node's CM.
    pub per_mad: Duration,
    /// Queue behind this node's backlog instead of an own one (see the module docs).
    pub mirror: Option<usize>,
}

impl CmCost {
    /// A node that processes `mads_per_sec` MADs (received plus sent) per second.
    pub fn per_sec(mads_per_sec: f64) -> Self {
        let per_mad = if mads_per_sec > 0.0 && mads_per_sec.is_finite() {
            Duration::from_secs_f64(1.0 / mads_per_sec)
        } else {
            Duration::ZERO
        };
        CmCost {
            per_mad,
            mirror: None,
        }
    }
}

/// The servers of all nodes.
#[derive(Debug, Default)]
pub(super) struct Servers {
    /// Per node: its cost and when its server is free again.
    nodes: Vec<Option<(CmCost, Instant)>>,
}

impl Servers {
    pub(super) fn set(&mut self, node: usize, cost: CmCost, now: Instant) {
        if self.nodes.len() <= node {
            self.nodes.resize(node + 1, None);
        }
        if let Some(slot) = self.nodes.get_mut(node) {
            *slot = Some((cost, now));
        }
    }

    pub(super) fn has_cost(&self, node: usize) -> bool {
        matches!(self.nodes.get(node), Some(Some(_)))
    }

    /// When a job of `node` that arrives at `at` finishes (and books it).
    pub(super) fn serve(&mut self, node: usize, at: Instant) -> Instant {
        let Some(Some((cost, _))) = self.nodes.get(node).copied() else {
            return at;
        };
        match cost.mirror {
            Some(m) => {
                let busy = match self.nodes.get(m) {
                    Some(Some((_, b))) => *b,
                    _ => at,
                };
                at.max(busy) + cost.per_mad
            }
            None => {
                let done = match self.nodes.get_mut(node) {
                    Some(Some((_, busy))) => {
                        *busy = at.max(*busy) + cost.per_mad;
                        *busy
                    }
                    _ => at,
                };
                done
            }
        }
    }
}
