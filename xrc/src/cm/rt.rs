//! [`XrcServer`]: the XRC target on ibcm's tokio runtime — an [`ibcm::rt::Cm`] whose driver
//! runs the [`XrcTarget`] as its app ([`Cm::bind_with_app`]).
//!
//! The target sees every event inside the driver task with the endpoint at hand, exactly as
//! in the simulator: it answers XRC REQs for its services (REP or REJ, several at a time),
//! tears down connections whose TGT QP went away (REJ before the RTU, DREQ after), notes the
//! endpoint's TimeWait quarantines, and the driver's one timer fires the registry's
//! quarantines. Events it does not consume (REQs of other services or transports, the
//! handles' own connections) reach the [`Cm`]'s handles as usual.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use ibcm::proto::EndpointConfig;
//! use ibcm::rt::{Cm, CmError, MemNetwork};
//! use ibcm_mad::{Guid, Qpn, ServiceId};
//! use ibcm_xrc::cm::rt::XrcServer;
//! use ibcm_xrc::cm::{xrc_connect_params, IniOutcome, XrcService, XrcTarget, XrcTargetConfig};
//! use ibcm_xrc::verbs::model::{KernelModel, ModelConfig};
//! use ibcm_xrc::{DomainSpec, RegistryConfig, SrqNum, TgtRegistry, Verbs, XrcReqData};
//!
//! let net = MemNetwork::new();
//! let t_addr = "127.0.0.2:4791".parse::<std::net::SocketAddr>().unwrap().into();
//! let i_addr = "127.0.0.1:4791".parse::<std::net::SocketAddr>().unwrap().into();
//! let cfg = EndpointConfig { local_ca_guid: Guid(2), ..EndpointConfig::default() };
//! let (i_cm, _) = Cm::bind(net.transport(i_addr), EndpointConfig::default());
//!
//! let kernel = KernelModel::new(ModelConfig::mlx5());
//! let mut reg = TgtRegistry::new(Box::new(kernel.spawn()), RegistryConfig::default());
//! let dom = reg.open_domain("job", DomainSpec::Private).unwrap();
//! let worker = kernel.spawn().process();
//! let target = XrcTarget::new(reg, XrcTargetConfig::default());
//! let (server, _) = XrcServer::bind(net.transport(t_addr), cfg, target);
//! let sid = ServiceId(0x1000);
//! server
//!     .listen(sid, XrcService::new(dom, worker, vec![SrqNum::new(0x10).unwrap()]))
//!     .await
//!     .unwrap();
//!
//! let p = xrc_connect_params(t_addr, sid, Qpn::new(0x99).unwrap(), &XrcReqData::any(None), &[]).unwrap();
//! let conn = i_cm.connect(p).await.unwrap();
//! // The worker exits: its TGT QP (ProcessBound, the default) goes; the DREQ says why.
//! server.with_target(move |t, now| { t.registry_mut().process_exit(now, worker); }).await.unwrap();
//! let why = IniOutcome::from_close(&conn.closed().await);
//! assert!(why.is_target_gone(), "{why}");
//! // A reconnect naming the gone QP gets REJ 1 "target gone".
//! let qpn = match why { IniOutcome::TargetGone { qpn, .. } => qpn.unwrap(), _ => unreachable!() };
//! let p = xrc_connect_params(t_addr, sid, Qpn::new(0x9a).unwrap(), &XrcReqData::attach(qpn), &[]).unwrap();
//! match i_cm.connect(p).await {
//!     Err(CmError::Connection(e)) => assert!(IniOutcome::from_close(&e).is_target_gone()),
//!     other => panic!("{other:?}"),
//! }
//! # }
//! ```

use std::io;
use std::time::Instant;

use ibcm::proto::{Endpoint, EndpointConfig};
use ibcm::rt::{Cm, CmError, DatagramTransport};
use ibcm_mad::{Qpn, ServiceId};
use tokio::task::JoinHandle;

use super::{TargetEvent, TargetObserver, XrcService, XrcTarget};
use crate::registry::TgtRegistry;

/// An [`XrcTarget`] running as the app of an [`ibcm::rt::Cm`]'s driver (module docs).
/// Cloning shares it.
#[derive(Clone, Debug)]
pub struct XrcServer {
    cm: Cm,
}

impl XrcServer {
    /// Starts an endpoint on `transport` whose driver runs `target` as its app. Returns the
    /// server and the driver task ([`Cm::bind_with_app`]).
    pub fn bind<T: DatagramTransport>(
        transport: T,
        config: EndpointConfig,
        target: XrcTarget,
    ) -> (Self, JoinHandle<io::Result<()>>) {
        let (cm, task) = Cm::bind_with_app(transport, config, target);
        (Self { cm }, task)
    }

    /// The endpoint's handle (connect, listen for other services, stats…).
    pub fn cm(&self) -> &Cm {
        &self.cm
    }

    /// Runs `f` on the target and the endpoint inside the driver, at the driver's time. The
    /// DREQs and REJs that follow go out at once (`App::poll`).
    ///
    /// # Errors
    /// [`CmError::DriverGone`].
    pub async fn with<R, F>(&self, f: F) -> Result<R, CmError>
    where
        R: Send + 'static,
        F: FnOnce(&mut XrcTarget, &mut Endpoint, Instant) -> R + Send + 'static,
    {
        self.cm.with_app(f).await
    }

    /// Runs `f` on the target at the driver's time (destroy a QP, report a process exit,
    /// close a domain, read events…); the DREQs and REJs that follow go out at once.
    ///
    /// # Errors
    /// [`CmError::DriverGone`].
    pub async fn with_target<R, F>(&self, f: F) -> Result<R, CmError>
    where
        R: Send + 'static,
        F: FnOnce(&mut XrcTarget, Instant) -> R + Send + 'static,
    {
        self.with(move |t, _, now| f(t, now)).await
    }

    /// Answers the XRC REQs for `service_id` as `service` ([`XrcTarget::listen`]).
    ///
    /// # Errors
    /// [`CmError::AlreadyListening`] if the endpoint listens on `service_id` already (an
    /// XRC service listened on, or a [`Cm::listen`] listener): the first one stays as it was
    /// (a service only [`XrcTarget::serve`]d, not listened on, is replaced);
    /// [`CmError::DriverGone`].
    pub async fn listen(&self, service_id: ServiceId, service: XrcService) -> Result<(), CmError> {
        self.with(move |t, ep, _| {
            if ep.is_listening(service_id) {
                return Err(CmError::AlreadyListening(service_id));
            }
            t.listen(ep, service_id, service);
            Ok(())
        })
        .await?
    }

    /// Leaked TGT QPs, phantom bindings included ([`XrcTarget::leaks`]).
    ///
    /// # Errors
    /// [`CmError::DriverGone`].
    pub async fn leaks(&self) -> Result<Vec<crate::registry::Leak>, CmError> {
        self.with(|t, ep, _| t.leaks(ep)).await
    }

    /// Registry bindings the endpoint no longer knows ([`XrcTarget::stale_conns`]).
    ///
    /// # Errors
    /// [`CmError::DriverGone`].
    pub async fn stale_conns(&self) -> Result<Vec<(ibcm::proto::ConnId, Qpn)>, CmError> {
        self.with(|t, ep, _| t.stale_conns(ep)).await
    }

    /// The next [`TargetEvent`] ([`XrcTarget::poll_event`]).
    ///
    /// # Errors
    /// [`CmError::DriverGone`].
    pub async fn poll_event(&self) -> Result<Option<TargetEvent>, CmError> {
        self.with_target(|t, _| t.poll_event()).await
    }

    /// Hands every [`TargetEvent`] to `f` as it happens ([`XrcTarget::set_observer`]).
    ///
    /// # Errors
    /// [`CmError::DriverGone`].
    pub async fn set_observer(&self, f: TargetObserver) -> Result<(), CmError> {
        self.with_target(move |t, _| t.set_observer(f)).await
    }

    /// The keeper holding the registry's handles died; see [`XrcTarget::keeper_crash`].
    ///
    /// # Errors
    /// [`CmError::DriverGone`].
    pub async fn keeper_crash(
        &self,
        restarted: TgtRegistry<ibcm::proto::ConnId>,
    ) -> Result<(), CmError> {
        self.with_target(move |t, now| t.keeper_crash(now, restarted))
            .await
    }
}
