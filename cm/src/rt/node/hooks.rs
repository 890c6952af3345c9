//! What the daemon side asks of its embedder ([`NodeHooks`]: XRC target services, the keeper,
//! the end of a session's holdings) and what it gives the hooks: who a session is
//! ([`SessionInfo`]) and where to report ([`EventSink`]).

use std::future::Future;
use std::pin::Pin;

use ibcm_mad::ServiceId;

use super::proto::{DaemonMsg, WireTgtQp};
use super::server::Outbox;
#[cfg(doc)]
use super::{config::ServerConfig, proto::Op};

/// Who a session is: its number and its peer's credentials (`SO_PEERCRED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionInfo {
    /// The session's number (unique in this daemon's life).
    pub id: u64,
    /// The client's user.
    pub uid: u32,
    /// The client's group.
    pub gid: u32,
    /// The client's process, if the kernel said.
    pub pid: Option<i32>,
}

/// A boxed future, for [`NodeHooks`].
pub type HookFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Where a hook reports events about a session's XRC services ([`DaemonMsg::XrcEvent`]).
#[derive(Debug, Clone)]
pub struct EventSink {
    pub(super) out: Outbox,
}

impl EventSink {
    /// Sends one line about `service_id` to the session's client (dropped if its queue is
    /// full: the session is then closed).
    pub fn xrc_event(&self, service_id: ServiceId, text: String) {
        self.out.push(&DaemonMsg::XrcEvent {
            service_id: service_id.0,
            text,
        });
    }

    /// Sends one event of the XRC keeper's protocol to the session's client
    /// ([`DaemonMsg::KeeperEvent`]).
    pub fn keeper_event(&self, event: serde_json::Value) {
        self.out.push(&DaemonMsg::KeeperEvent { event });
    }
}

/// An [`Op::XrcListen`]'s service: where its TGT QPs come from.
#[derive(Debug, Clone, Copy)]
pub struct XrcListenReq<'a> {
    /// The policy of the QPs it creates.
    pub policy: &'a str,
    /// The SRQ numbers its REPs announce.
    pub srqns: &'a [u32],
    /// A keeper domain by name (the client's, or one it was admitted to).
    pub domain: Option<&'a str>,
    /// The TGT QP answering its REQs in mode `any`.
    pub tgt_qpn: Option<u32>,
}

/// What the daemon adds around the CM: XRC target services and the end of a session's
/// holdings. Implemented by `ibcmd` with the `ibcm-xrc` registry.
pub trait NodeHooks: Send + Sync + 'static {
    /// [`Op::XrcListen`]: serve XRC REQs for `service_id` as `session`'s target.
    fn xrc_listen<'a>(
        &'a self,
        session: SessionInfo,
        service_id: ServiceId,
        req: XrcListenReq<'a>,
        events: EventSink,
    ) -> HookFuture<'a, Result<(), String>>;

    /// [`Op::Keeper`]: one request of the XRC keeper's protocol; the answer is the keeper's
    /// reply. `events` reaches the session with the keeper's events. Default: refused.
    fn keeper(
        &self,
        session: SessionInfo,
        req: serde_json::Value,
        events: EventSink,
    ) -> HookFuture<'_, Result<serde_json::Value, String>> {
        let _ = (session, req, events);
        Box::pin(async { Err("this daemon serves no XRC keeper".to_owned()) })
    }

    /// [`Op::XrcDestroy`]: destroy the TGT QPs `session` owns; how many.
    fn xrc_destroy(&self, session: SessionInfo) -> HookFuture<'_, Result<u64, String>>;

    /// [`Op::XrcUnlisten`].
    fn xrc_unlisten(&self, session: SessionInfo, service_id: ServiceId) -> HookFuture<'_, ()>;

    /// The session ended (its client exited or closed the socket): end its XRC holdings per
    /// their policies. Called after its connections were disconnected.
    fn session_ended(&self, session: SessionInfo) -> HookFuture<'_, ()>;

    /// The connections the XRC target holds for `session`'s services, and for every service
    /// of its user (those of ended sessions until they close): counted against
    /// [`ServerConfig::max_connections`] and [`ServerConfig::max_connections_per_user`].
    /// Default: none.
    fn xrc_connections(&self, session: SessionInfo) -> (usize, usize) {
        let _ = session;
        (0, 0)
    }

    /// [`Op::XrcOrphans`]: the TGT QPs without a living owner, and the leaks. Default: none.
    fn xrc_orphans(&self, session: SessionInfo) -> HookFuture<'_, Result<Vec<WireTgtQp>, String>> {
        let _ = session;
        Box::pin(async { Ok(Vec::new()) })
    }

    /// [`Op::XrcReclaim`]: destroy orphans of `session`'s user (root: any), all or `qpn`;
    /// how many. Default: none.
    fn xrc_reclaim(
        &self,
        session: SessionInfo,
        qpn: Option<u32>,
    ) -> HookFuture<'_, Result<u64, String>> {
        let _ = (session, qpn);
        Box::pin(async { Ok(0) })
    }
}
