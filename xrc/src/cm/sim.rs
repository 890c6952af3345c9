//! [`XrcTarget`] and [`XrcInitiator`] as the applications ([`ibcm::App`]) of nodes of ibcm's
//! deterministic simulator ([`ibcm::sim::SimNet`]).
//!
//! The handles share the app with the simulator, so a test (or the `xrc_policies` example)
//! can act on the target between steps — destroy a QP, let a process exit, close a domain —
//! and watch the DREQs and REJs cross the simulated wire. The simulator fires the registry's
//! quarantine timers at their exact deadlines like the endpoints' ([`SimNet::run_until_time`],
//! [`SimNet::run_until`]…).
//!
//! ```
//! use ibcm::proto::EndpointConfig;
//! use ibcm::sim::SimNet;
//! use ibcm_mad::{Qpn, ServiceId};
//! use ibcm_xrc::cm::sim::{SimInitiator, SimTarget};
//! use ibcm_xrc::cm::{IniOutcome, XrcService, XrcTarget, XrcTargetConfig};
//! use ibcm_xrc::verbs::model::{KernelModel, ModelConfig};
//! use ibcm_xrc::{DomainSpec, OwnershipPolicy, RegistryConfig, SrqNum, TgtRegistry, Verbs, XrcReqData};
//! use std::time::Duration;
//!
//! let kernel = KernelModel::new(ModelConfig::mlx5());
//! let mut reg = TgtRegistry::new(Box::new(kernel.spawn()), RegistryConfig::default());
//! let dom = reg.open_domain("job", DomainSpec::Private).unwrap();
//! let owner = kernel.spawn().process();
//!
//! let mut net = SimNet::new(1);
//! let t = net.add_node(EndpointConfig::default());
//! let i = net.add_node(EndpointConfig::default());
//! let target = SimTarget::install(&mut net, t, XrcTarget::new(reg, XrcTargetConfig::default()));
//! let sid = ServiceId(0x1000);
//! target.with(&mut net, |x, ep, _| {
//!     x.listen(ep, sid, XrcService::new(dom, owner, vec![SrqNum::new(0x10).unwrap()]))
//! });
//! let ini = SimInitiator::install(&mut net, i);
//! let peer = net.addr(t);
//! let data = XrcReqData::any(Some(OwnershipPolicy::Explicit));
//! let c = ini.connect(&mut net, peer, sid, Qpn::new(0x99).unwrap(), &data).unwrap();
//! net.run_until_time(net.now() + Duration::from_millis(10));
//! let qpn = ini.with(|x| x.rep(c).map(|r| r.tgt_qpn)).unwrap();
//! // The owner destroys the QP: the target sends a DREQ, the initiator learns why.
//! target.with(&mut net, |x, _, now| x.registry_mut().destroy(now, qpn, owner)).unwrap();
//! net.run_until_time(net.now() + Duration::from_millis(10));
//! assert!(matches!(ini.with(|x| x.outcome(c).cloned()), Some(IniOutcome::TargetGone { .. })));
//! ```

use std::cell::{Ref, RefCell, RefMut};
use std::rc::Rc;
use std::time::Instant;

use ibcm::proto::{ConnId, ConnectError, Endpoint, Event, PeerAddr};
use ibcm::sim::{AppFn, SimNet};
use ibcm::App;
use ibcm_mad::{Qpn, ServiceId};

use super::{IniObserver, TargetObserver, XrcInitiator, XrcTarget};
use ibcm_mad::xrc::XrcReqData;

/// A shared app installed in a node, and what gets the events it does not consume.
struct Installed<A> {
    app: Rc<RefCell<A>>,
    fallback: Option<AppFn>,
}

impl<A: App> App for Installed<A> {
    fn handle_event(&mut self, ep: &mut Endpoint, now: Instant, event: &Event) -> bool {
        let mine = self
            .app
            .try_borrow_mut()
            .is_ok_and(|mut a| a.handle_event(ep, now, event));
        if !mine {
            if let Some(f) = self.fallback.as_mut() {
                f(ep, now, event);
            }
        }
        mine
    }

    fn poll(&mut self, ep: &mut Endpoint, now: Instant) {
        if let Ok(mut a) = self.app.try_borrow_mut() {
            a.poll(ep, now);
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.app.try_borrow().ok().and_then(|a| a.poll_timeout())
    }

    fn handle_timeout(&mut self, ep: &mut Endpoint, now: Instant) {
        if let Ok(mut a) = self.app.try_borrow_mut() {
            a.handle_timeout(ep, now);
        }
    }
}

fn install<A: App + 'static>(
    net: &mut SimNet,
    node: usize,
    app: A,
    fallback: Option<AppFn>,
) -> Rc<RefCell<A>> {
    let app = Rc::new(RefCell::new(app));
    net.set_app(
        node,
        Installed {
            app: app.clone(),
            fallback,
        },
    );
    app
}

/// An [`XrcTarget`] installed as a simulator node's application.
#[derive(Clone)]
pub struct SimTarget {
    node: usize,
    target: Rc<RefCell<XrcTarget>>,
}

impl std::fmt::Debug for SimTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimTarget")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl SimTarget {
    /// Installs `target` as node `node`'s application (events it does not handle are
    /// ignored).
    ///
    /// # Panics
    /// If `node` is not a node of `net` (a test bug; the simulator's own rule).
    pub fn install(net: &mut SimNet, node: usize, target: XrcTarget) -> Self {
        let target = install(net, node, target, None);
        Self { node, target }
    }

    /// Installs `target` with `fallback` for the events it does not handle (non-XRC REQs,
    /// other connections of the node).
    ///
    /// # Panics
    /// If `node` is not a node of `net`.
    pub fn install_with(net: &mut SimNet, node: usize, target: XrcTarget, fallback: AppFn) -> Self {
        let target = install(net, node, target, Some(fallback));
        Self { node, target }
    }

    /// Hands every [`TargetEvent`](super::TargetEvent) to `f` as it happens, with its
    /// virtual time ([`XrcTarget::set_observer`]).
    ///
    /// # Panics
    /// If the target is borrowed.
    pub fn set_observer(&self, f: TargetObserver) {
        self.target.borrow_mut().set_observer(f);
    }

    /// The node.
    pub fn node(&self) -> usize {
        self.node
    }

    /// The target, shared.
    ///
    /// # Panics
    /// If it is mutably borrowed (inside [`SimTarget::with`]).
    pub fn target(&self) -> Ref<'_, XrcTarget> {
        self.target.borrow()
    }

    /// The target, mutably. Teardowns it causes are sent after the next input of the node
    /// (or at the next [`SimTarget::with`]); prefer [`SimTarget::with`].
    ///
    /// # Panics
    /// If it is already borrowed.
    pub fn target_mut(&self) -> RefMut<'_, XrcTarget> {
        self.target.borrow_mut()
    }

    /// Runs `f` on the target and its endpoint at the current virtual time, then executes
    /// the teardowns it caused (the DREQs and REJs go on the wire at the next step).
    ///
    /// # Panics
    /// If the target is already borrowed, or the node does not exist.
    pub fn with<R>(
        &self,
        net: &mut SimNet,
        f: impl FnOnce(&mut XrcTarget, &mut Endpoint, Instant) -> R,
    ) -> R {
        let now = net.now();
        let ep = net.endpoint(self.node);
        let mut t = self.target.borrow_mut();
        let r = f(&mut t, ep, now);
        t.flush(ep, now);
        r
    }
}

/// An [`XrcInitiator`] installed as a simulator node's application.
#[derive(Clone)]
pub struct SimInitiator {
    node: usize,
    ini: Rc<RefCell<XrcInitiator>>,
}

impl std::fmt::Debug for SimInitiator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimInitiator")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl SimInitiator {
    /// Installs a new initiator as node `node`'s application.
    ///
    /// # Panics
    /// If `node` is not a node of `net`.
    pub fn install(net: &mut SimNet, node: usize) -> Self {
        let ini = install(net, node, XrcInitiator::new(), None);
        Self { node, ini }
    }

    /// Hands every [`IniEvent`](super::IniEvent) to `f` as it happens, with its virtual time
    /// ([`XrcInitiator::set_observer`]).
    ///
    /// # Panics
    /// If the initiator is borrowed.
    pub fn set_observer(&self, f: IniObserver) {
        self.ini.borrow_mut().set_observer(f);
    }

    /// The node.
    pub fn node(&self) -> usize {
        self.node
    }

    /// Sends an XRC REQ from INI QP `ini_qpn` to `peer` at the current virtual time.
    ///
    /// # Errors
    /// The endpoint's [`ConnectError`].
    ///
    /// # Panics
    /// If the initiator is borrowed.
    pub fn connect(
        &self,
        net: &mut SimNet,
        peer: PeerAddr,
        service_id: ServiceId,
        ini_qpn: Qpn,
        data: &XrcReqData,
    ) -> Result<ConnId, ConnectError> {
        self.with_ep(net, |x, ep, now| {
            x.connect(ep, now, peer, service_id, ini_qpn, data, &[])
        })
    }

    /// Sends a REQ with parameters made by [`xrc_connect_params`](super::xrc_connect_params)
    /// (and adjusted, e.g. shorter CM timeouts).
    ///
    /// # Errors
    /// The endpoint's [`ConnectError`].
    ///
    /// # Panics
    /// If the initiator is borrowed.
    pub fn connect_with(
        &self,
        net: &mut SimNet,
        params: ibcm::proto::ConnectParams,
    ) -> Result<ConnId, ConnectError> {
        self.with_ep(net, |x, ep, now| x.connect_with(ep, now, params))
    }

    /// Runs `f` on the initiator and its endpoint at the current virtual time (e.g. to
    /// disconnect).
    ///
    /// # Panics
    /// If the initiator is borrowed.
    pub fn with_ep<R>(
        &self,
        net: &mut SimNet,
        f: impl FnOnce(&mut XrcInitiator, &mut Endpoint, Instant) -> R,
    ) -> R {
        let now = net.now();
        let ep = net.endpoint(self.node);
        f(&mut self.ini.borrow_mut(), ep, now)
    }

    /// Reads (or changes) the initiator.
    ///
    /// # Panics
    /// If the initiator is borrowed.
    pub fn with<R>(&self, f: impl FnOnce(&mut XrcInitiator) -> R) -> R {
        f(&mut self.ini.borrow_mut())
    }
}
