//! What a static all-to-all wire-up consists of: the operations each process starts, who
//! starts each, and the closed-form counts (QPs, MADs, connection ends) they add up to.

use clap::ValueEnum;

/// How processes are connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Mode {
    /// One RC connection per pair of processes on different nodes.
    Rc,
    /// One XRC INI per (process, remote node), each to its own TGT on the remote node.
    Xrc,
    /// One physical XRC connection per ordered node pair; a SIDR_REQ/SIDR_REP per pair of
    /// processes for the logical connection.
    XrcSidr,
}

impl Mode {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Mode::Rc => "rc",
            Mode::Xrc => "xrc",
            Mode::XrcSidr => "xrc-sidr",
        }
    }
}

/// One operation a node starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// RC connection of local process `p` to process `q` of `node`.
    Rc { p: u32, node: u32, q: u32 },
    /// XRC INI of local process `p` to a new TGT on `node`.
    Xrc { p: u32, node: u32 },
    /// The node's physical XRC INI to `node` (xrc-sidr).
    Phys { node: u32 },
    /// SIDR exchange of local process `p` with process `q` of `node` (xrc-sidr).
    Sidr { p: u32, node: u32, q: u32 },
}

/// The fabric: N nodes × P processes, one mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    pub nodes: u32,
    pub ppn: u32,
    pub mode: Mode,
}

/// Where a worker of a node stands in its list of operations: the ring distance to the
/// target node and the remote process.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Cursor {
    d: u32,
    q: u32,
}

impl Shape {
    /// Workers per node that start operations: the processes, plus for xrc-sidr the node's
    /// agent for physical connections (worker index `ppn`).
    pub(crate) fn workers(&self) -> u32 {
        match self.mode {
            Mode::XrcSidr => self.ppn + 1,
            Mode::Rc | Mode::Xrc => self.ppn,
        }
    }

    /// Whether process `p` of node `n` starts the exchange with process `q` of node `m`
    /// (RC connection or SIDR exchange). Node `n` starts with the nodes at ring distance
    /// 1..=(N−1)/2 ahead of it; with an even N the node opposite is split by process: the
    /// lower process index starts, and with equal indices the lower node. Every node starts
    /// the same number of exchanges (up to P with the opposite node), so the per-node model
    /// can mirror one node's schedule onto its peers.
    pub(crate) fn initiates(&self, n: u32, p: u32, m: u32, q: u32) -> bool {
        let nn = self.nodes;
        let d = (m + nn - n) % nn;
        if d == 0 {
            return false;
        }
        if 2 * d < nn {
            return true;
        }
        if 2 * d > nn {
            return false;
        }
        p < q || (p == q && n < m)
    }

    /// The next operation worker `w` of node `n` starts, in ring order from the next node.
    pub(crate) fn next_op(&self, n: u32, w: u32, c: &mut Cursor) -> Option<Op> {
        let nn = self.nodes;
        loop {
            if c.d == 0 {
                c.d = 1;
            }
            if c.d >= nn {
                return None;
            }
            let node = (n + c.d) % nn;
            match self.mode {
                Mode::Xrc => {
                    c.d += 1;
                    return Some(Op::Xrc { p: w, node });
                }
                Mode::XrcSidr if w == self.ppn => {
                    c.d += 1;
                    return Some(Op::Phys { node });
                }
                Mode::Rc | Mode::XrcSidr => {
                    let q = c.q;
                    c.q += 1;
                    if c.q >= self.ppn {
                        c.q = 0;
                        c.d += 1;
                    }
                    if self.initiates(n, w, node, q) {
                        return Some(if self.mode == Mode::Rc {
                            Op::Rc { p: w, node, q }
                        } else {
                            Op::Sidr { p: w, node, q }
                        });
                    }
                }
            }
        }
    }

    fn pairs_of_nodes(&self) -> u64 {
        let n = u64::from(self.nodes);
        n * n.saturating_sub(1)
    }

    /// QPs per node: RC (N−1)·P² (one per pair of processes); XRC (N−1)·P INIs + (N−1)·P
    /// TGTs = 2·(N−1)·P; xrc-sidr (N−1) INIs + (N−1) TGTs = 2·(N−1).
    pub(crate) fn qps_per_node(&self) -> u64 {
        let n1 = u64::from(self.nodes.saturating_sub(1));
        let p = u64::from(self.ppn);
        match self.mode {
            Mode::Rc => n1 * p * p,
            Mode::Xrc => 2 * n1 * p,
            Mode::XrcSidr => 2 * n1,
        }
    }

    /// Connections the CM of one node holds when the mesh is up (the QPs above; a SIDR
    /// exchange leaves no state behind).
    pub(crate) fn conns_per_node(&self) -> u64 {
        self.qps_per_node()
    }

    /// MADs of the whole fabric without loss: 3 per connection (REQ, REP, RTU), 2 per SIDR
    /// exchange. RC 3·N(N−1)/2·P²; XRC 3·N(N−1)·P; xrc-sidr 3·N(N−1) + N(N−1)·P².
    pub(crate) fn mads(&self) -> u64 {
        let pairs = self.pairs_of_nodes();
        let p = u64::from(self.ppn);
        match self.mode {
            Mode::Rc => 3 * pairs * p * p / 2,
            Mode::Xrc => 3 * pairs * p,
            Mode::XrcSidr => 3 * pairs + pairs * p * p,
        }
    }

    /// Completions one node records: every connection end it holds, plus for xrc-sidr both
    /// ends of every logical connection of its processes.
    pub(crate) fn ends_per_node(&self) -> u64 {
        let n1 = u64::from(self.nodes.saturating_sub(1));
        let p = u64::from(self.ppn);
        match self.mode {
            Mode::Rc | Mode::Xrc => self.qps_per_node(),
            Mode::XrcSidr => 2 * n1 + n1 * p * p,
        }
    }

    /// What one process waits for before it can reach every other process: RC its (N−1)·P
    /// connections, XRC its N−1 INIs, xrc-sidr its (N−1)·P logical connections.
    pub(crate) fn per_process(&self) -> u64 {
        let n1 = u64::from(self.nodes.saturating_sub(1));
        let p = u64::from(self.ppn);
        match self.mode {
            Mode::Rc | Mode::XrcSidr => n1 * p,
            Mode::Xrc => n1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every pair of processes on different nodes has exactly one starter, and walking every
    /// worker's list yields exactly the closed-form number of exchanges.
    #[test]
    fn every_pair_has_one_starter() {
        for nodes in [2u32, 3, 4, 5, 8] {
            for ppn in [1u32, 2, 3] {
                for mode in [Mode::Rc, Mode::Xrc, Mode::XrcSidr] {
                    let s = Shape { nodes, ppn, mode };
                    for n in 0..nodes {
                        for m in 0..nodes {
                            for p in 0..ppn {
                                for q in 0..ppn {
                                    if n != m {
                                        assert!(s.initiates(n, p, m, q) ^ s.initiates(m, q, n, p));
                                    }
                                }
                            }
                        }
                    }
                    let mut ops = 0u64;
                    let mut mads = 0u64;
                    for n in 0..nodes {
                        for w in 0..s.workers() {
                            let mut c = Cursor::default();
                            while let Some(op) = s.next_op(n, w, &mut c) {
                                ops += 1;
                                mads += if matches!(op, Op::Sidr { .. }) { 2 } else { 3 };
                            }
                        }
                    }
                    assert_eq!(mads, s.mads(), "{s:?}");
                    assert!(ops > 0);
                }
            }
        }
    }
}
