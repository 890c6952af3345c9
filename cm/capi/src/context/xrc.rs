//! XRC through the node service: the target services the daemon hosts
//! ([`Context::xrc_listen`]) and the keeper's requests ([`Context::keeper`]), with their
//! refusals as status codes.

use ibcm_mad::ServiceId;

use super::{lock, Context};
use crate::error::{Error, Result};
use crate::ffi::types::ibcm_status::*;

/// The status of a keeper refusal of kind `kind` (docs/xrc.md §8.5).
fn keeper_code(kind: &str) -> crate::ffi::types::ibcm_status {
    match kind {
        "unknown-domain" | "unknown-qpn" | "not-registered" | "unknown-srq" => IBCM_ENOENT,
        "gone" => IBCM_ECLOSED,
        "no-xrc" | "unsupported" => IBCM_EUNSUPPORTED,
        "bad-modify" | "bad-request" => IBCM_EINVAL,
        "verbs" | "error" => IBCM_EIO,
        _ => IBCM_EREFUSED,
    }
}

/// An XRC listen's refusal: the daemon words the keeper's (and a device's) refusals as
/// "`kind`: message", which get their kind's status as [`Context::keeper`]'s do; any other
/// refusal is `IBCM_EREFUSED`.
fn xrc_refusal(e: ibcm::rt::node::NodeError) -> Error {
    match e {
        ibcm::rt::node::NodeError::Refused(why) => {
            let kind = why.split_once(": ").map_or("", |(k, _)| k);
            Error::new(keeper_code(kind), why)
        }
        other => other.into(),
    }
}

impl Context {
    /// Has the daemon serve `sid` as an XRC target of this context.
    pub(crate) fn xrc_listen(&self, sid: u64, policy: &str, srqns: &[u32]) -> Result<()> {
        self.live()?;
        self.block_on(self.node.xrc_listen(ServiceId(sid), policy, srqns))?
            .map_err(xrc_refusal)?;
        lock(&self.xrc_services).insert(sid);
        Ok(())
    }

    /// Stops serving `sid` as an XRC target; `IBCM_ENOENT` when this context does not serve
    /// it (as `ibcm_unlisten`).
    pub(crate) fn xrc_unlisten(&self, sid: u64) -> Result<()> {
        self.live()?;
        if !lock(&self.xrc_services).remove(&sid) {
            return Err(Error::new(
                IBCM_ENOENT,
                format!("not serving {} as an XRC target", ServiceId(sid)),
            ));
        }
        Ok(self.block_on(self.node.xrc_unlisten(ServiceId(sid)))??)
    }

    /// One request of the XRC keeper's protocol (docs/xrc.md §8.5) through the daemon: its
    /// result, or the keeper's refusal as an error of the matching class.
    pub(crate) fn keeper(&self, req: serde_json::Value) -> Result<serde_json::Value> {
        self.live()?;
        let reply = self.block_on(self.node.keeper(req))??;
        if reply.get("ok").and_then(serde_json::Value::as_bool) == Some(true) {
            return Ok(reply
                .get("result")
                .cloned()
                .unwrap_or(serde_json::Value::Null));
        }
        let kind = reply
            .pointer("/error/kind")
            .and_then(serde_json::Value::as_str)
            .unwrap_or("error");
        let msg = reply
            .pointer("/error/message")
            .and_then(serde_json::Value::as_str)
            .unwrap_or("the keeper refused the request");
        Err(Error::new(keeper_code(kind), format!("{kind}: {msg}")))
    }

    /// Has the daemon serve `sid` as an XRC target of this context in keeper domain
    /// `domain` (one this context opened), answering REQs with `tgt_qpn` when given.
    pub(crate) fn xrc_listen_in(
        &self,
        sid: u64,
        policy: &str,
        srqns: &[u32],
        domain: &str,
        tgt_qpn: Option<u32>,
    ) -> Result<()> {
        self.live()?;
        self.block_on(
            self.node
                .xrc_listen_in(ServiceId(sid), policy, srqns, domain, tgt_qpn),
        )?
        .map_err(xrc_refusal)?;
        lock(&self.xrc_services).insert(sid);
        Ok(())
    }

    /// Destroys this context's TGT QPs as their owner; how many.
    pub(crate) fn xrc_destroy(&self) -> Result<u64> {
        self.live()?;
        Ok(self.block_on(self.node.xrc_destroy())??)
    }
}
