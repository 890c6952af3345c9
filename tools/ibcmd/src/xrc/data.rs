//! The `sim` backend's XRC data path: a client's own XRC SRQs in a shared domain, and the
//! messages the node's TGT QPs receive into them.
//!
//! With `--backend verbs` none of this is the daemon's: a runtime opens the domain file with
//! `ibv_open_xrcd`, creates its XRC SRQs with rdma-core, and the device receives into them.
//! With `--backend sim` the software model stands in for both device and runtime:
//!
//! * each client that asks gets a process of the model ([`Runtime`]), which opens the
//!   keeper domain's file (as the runtime's `ibv_open_xrcd` would: the same domain, keyed by
//!   the file) and creates its SRQs there (`srq-create`), polled with `srq-recv`; when the
//!   client goes, that process exits and its SRQs with it;
//! * XRC SEND Only packets arriving on UDP 4791 for a QP other than QP1 (the transport's
//!   data sink, ICRC checked) are received by the model ([`KernelModel::deliver`]): into the
//!   SRQ the XRCETH names if the TGT QP is ready, the PSN in sequence and the SRQ in the
//!   QP's domain with room. Each outcome is counted by name (`data-counters`).
//!
//! Bounds: [`MAX_SRQS`] SRQs per client, [`MAX_WR`] unpolled messages per SRQ, messages up
//! to [`MAX_MESSAGE`] bytes (one SEND Only of a 1024-byte path MTU; SEND First/Middle/Last
//! are not modelled): at most 4 MiB held per client.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use ibcm::rt::DataPacket;
use ibcm_mad::frame::{xrceth, Opcode, XrcethRepr};
use ibcm_xrc::verbs::model::{KernelModel, ModelVerbs};
use ibcm_xrc::verbs::SrqAttr;
use ibcm_xrc::{DomainSpec, SrqHandle, Verbs as _, XrcdHandle};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tracing::debug;

use super::lock;

/// SRQs one client may hold.
pub(crate) const MAX_SRQS: usize = 16;
/// Unpolled messages one SRQ holds (its receives); `srq-create`'s `max_wr` is capped here.
pub(crate) const MAX_WR: u32 = 256;
/// The longest message received (a SEND Only of a 1024-byte path MTU); a longer SEND is
/// dropped (`too_long`).
pub(crate) const MAX_MESSAGE: usize = 1024;
/// Packets waiting between the transport and the model; more are dropped by the transport
/// (`data_dropped`).
pub(crate) const QUEUE: usize = 1024;

/// A client's process in the model: its domain handles (by file) and SRQs (by number, with
/// the file of their domain). A domain handle is held while an SRQ of its file is.
struct Runtime {
    verbs: ModelVerbs,
    xrcds: BTreeMap<PathBuf, XrcdHandle>,
    srqs: BTreeMap<u32, (SrqHandle, PathBuf)>,
}

/// The data path of the `sim` backend (module docs).
pub(crate) struct SimData {
    kernel: KernelModel,
    runtimes: Mutex<BTreeMap<u64, Runtime>>,
    counts: Mutex<BTreeMap<&'static str, u64>>,
}

/// A keeper-protocol refusal of `kind`, as the keeper words its own.
pub(crate) fn refused(kind: &str, message: impl Into<String>) -> Value {
    json!({ "ok": false, "error": { "kind": kind, "message": message.into() } })
}

fn ok(result: Value) -> Value {
    json!({ "ok": true, "result": result })
}

/// The operations this module serves, by their `op`.
pub(crate) const OPS: [&str; 4] = ["srq-create", "srq-destroy", "srq-recv", "data-counters"];

/// What a client without the `sim` backend gets for [`OPS`].
pub(crate) fn unsupported(op: &str) -> Value {
    refused(
        "unsupported",
        format!(
            "{op}: the daemon's backend is verbs: create XRC SRQs with rdma-core \
             (ibv_open_xrcd on the domain file, ibv_create_srq_ex) and poll their CQ"
        ),
    )
}

impl SimData {
    /// The data path on `kernel`; with `rx`, it receives what the transport hands over.
    pub(crate) fn new(kernel: KernelModel, rx: Option<mpsc::Receiver<DataPacket>>) -> Arc<Self> {
        let d = Arc::new(SimData {
            kernel,
            runtimes: Mutex::default(),
            counts: Mutex::default(),
        });
        if let Some(rx) = rx {
            tokio::spawn(receive(Arc::downgrade(&d), rx));
        }
        d
    }

    fn count(&self, what: &'static str) {
        *lock(&self.counts).entry(what).or_insert(0) += 1;
    }

    /// One packet from the wire: received, or why not (counted).
    fn receive(&self, p: &DataPacket) -> &'static str {
        if p.bth.opcode != Opcode::XRC_SEND_ONLY {
            return "unsupported_opcode";
        }
        let Ok(x) = XrcethRepr::parse(&xrceth::Packet::new_unchecked(&p.body[..])) else {
            return "truncated";
        };
        let payload = p.body.get(xrceth::HEADER_LEN..).unwrap_or(&[]);
        if payload.len() > MAX_MESSAGE {
            return "too_long";
        }
        self.kernel
            .deliver(p.bth.dest_qp, p.bth.psn, x.srqn, payload)
            .name()
    }

    /// A client request among [`OPS`]; `domain_file` is the file of the keeper domain an
    /// `srq-create` names (resolved by the caller under the keeper's rule), or the refusal.
    pub(crate) fn handle(
        &self,
        session: u64,
        req: &Value,
        domain_file: Option<Result<PathBuf, Value>>,
    ) -> Value {
        let op = req.get("op").and_then(Value::as_str).unwrap_or("");
        let srqn = || {
            req.get("srqn")
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| refused("bad-request", format!("{op}: needs \"srqn\"")))
        };
        let r = match op {
            "srq-create" => {
                let Some(file) = domain_file else {
                    return refused("bad-request", "srq-create: needs \"domain\"");
                };
                let max_wr = req
                    .get("max_wr")
                    .and_then(Value::as_u64)
                    .map_or(MAX_WR, |n| {
                        u32::try_from(n).unwrap_or(MAX_WR).clamp(1, MAX_WR)
                    });
                file.and_then(|path| self.create(session, path, max_wr))
            }
            "srq-destroy" => srqn().and_then(|n| self.destroy(session, n)),
            "srq-recv" => srqn().and_then(|n| self.recv(session, n)),
            "data-counters" => Ok(json!(*lock(&self.counts))),
            _ => Err(refused("bad-request", format!("unknown op {op:?}"))),
        };
        r.map_or_else(|e| e, ok)
    }

    fn create(&self, session: u64, path: PathBuf, max_wr: u32) -> Result<Value, Value> {
        let mut all = lock(&self.runtimes);
        let rt = all.entry(session).or_insert_with(|| Runtime {
            verbs: self.kernel.spawn(),
            xrcds: BTreeMap::new(),
            srqs: BTreeMap::new(),
        });
        if rt.srqs.len() >= MAX_SRQS {
            return Err(refused(
                "quota-exceeded",
                format!("{MAX_SRQS} XRC SRQs per client"),
            ));
        }
        let verbs_err = |e: ibcm_xrc::VerbsError| refused("verbs", e.to_string());
        let xrcd = match rt.xrcds.get(&path) {
            Some(&h) => h,
            None => rt
                .verbs
                .open_xrcd(&DomainSpec::existing(path.clone()))
                .map_err(verbs_err)?,
        };
        let attr = SrqAttr {
            max_wr,
            ..SrqAttr::default()
        };
        let made = rt
            .verbs
            .create_xrc_srq(xrcd, &attr)
            .and_then(|h| Ok((h, rt.verbs.srq_num(h)?)));
        let (h, n) = match made {
            Ok(v) => v,
            Err(e) => {
                if !rt.xrcds.contains_key(&path) {
                    let _ = rt.verbs.close_xrcd(xrcd);
                }
                return Err(verbs_err(e));
            }
        };
        rt.xrcds.insert(path.clone(), xrcd);
        rt.srqs.insert(n.get(), (h, path));
        Ok(json!({ "srqn": n.get(), "max_wr": max_wr }))
    }

    fn destroy(&self, session: u64, srqn: u32) -> Result<Value, Value> {
        let mut all = lock(&self.runtimes);
        let rt = all.get_mut(&session).ok_or_else(|| not_yours(srqn))?;
        let (h, path) = rt.srqs.remove(&srqn).ok_or_else(|| not_yours(srqn))?;
        let _ = rt.verbs.destroy_srq(h);
        // its domain handle goes with the last SRQ made through it
        if !rt.srqs.values().any(|(_, p)| *p == path) {
            if let Some(x) = rt.xrcds.remove(&path) {
                let _ = rt.verbs.close_xrcd(x);
            }
        }
        if rt.srqs.is_empty() {
            all.remove(&session);
        }
        Ok(json!({}))
    }

    fn recv(&self, session: u64, srqn: u32) -> Result<Value, Value> {
        let mut all = lock(&self.runtimes);
        let rt = all.get_mut(&session).ok_or_else(|| not_yours(srqn))?;
        let &(h, _) = rt.srqs.get(&srqn).ok_or_else(|| not_yours(srqn))?;
        let m = rt
            .verbs
            .poll_srq(h)
            .map_err(|e| refused("verbs", e.to_string()))?;
        // the message's bytes as a JSON array (null when none)
        Ok(json!({ "data": m }))
    }

    /// The client went: its process exits, its SRQs with it.
    pub(crate) fn session_ended(&self, session: u64) {
        lock(&self.runtimes).remove(&session);
    }
}

fn not_yours(srqn: u32) -> Value {
    refused(
        "unknown-srq",
        format!("no XRC SRQ {srqn:#x} of this client (srq-create makes one)"),
    )
}

/// Receives what the transport hands over until it stops or the data path is gone.
async fn receive(d: std::sync::Weak<SimData>, mut rx: mpsc::Receiver<DataPacket>) {
    while let Some(p) = rx.recv().await {
        let Some(d) = d.upgrade() else { return };
        let what = d.receive(&p);
        d.count(what);
        if what != "received" {
            debug!(from = %p.from, qpn = %p.bth.dest_qp, psn = p.bth.psn.get(), what, "XRC SEND not received");
        }
    }
}
