//! [`XrcTarget`] and [`XrcInitiator`] as applications of nodes of ibcm's deterministic
//! simulator ([`ibcm::sim::SimNet`]).
//!
//! The simulator calls a node's application for every event of its endpoint; these helpers
//! install the XRC logic as that application and keep a shared handle so a test (or the
//! `xrc_policies` example) can act on the target between steps — destroy a QP, let a process
//! exit, close a domain — and watch the DREQs and REJs cross the simulated wire.
//!
//! The registry's quarantine timers are not the endpoint's, so the simulator does not see
//! them: advance time with [`SimTarget::run_until_time`], which fires them at their exact
//! deadline.
//!
//! ```
//! use ibcm::proto::EndpointConfig;
//! use ibcm::sim::SimNet;
//! use ibcm_mad::{Qpn, ServiceId};
//! use ibcm_xrc::cm::sim::{SimInitiator, SimTarget};
//! use ibcm_xrc::cm::{IniOutcome, XrcService, XrcTarget, XrcTargetConfig};
//! use ibcm_xrc::verbs::model::{ModelConfig, KernelModel};
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
//! let at = net.now() + Duration::from_millis(10);
//! target.run_until_time(&mut net, at);
//! let qpn = ini.with(|x| x.rep(c).map(|r| r.tgt_qpn)).unwrap();
//! // The owner destroys the QP: the target sends a DREQ, the initiator learns why.
//! target.with(&mut net, |x, _, now| x.registry_mut().destroy(now, qpn, owner)).unwrap();
//! let at = net.now() + Duration::from_millis(10);
//! target.run_until_time(&mut net, at);
//! assert!(matches!(ini.with(|x| x.outcome(c).cloned()), Some(IniOutcome::TargetGone { .. })));
//! ```

use std::cell::{Ref, RefCell, RefMut};
use std::rc::Rc;
use std::time::Instant;

use ibcm::proto::{ConnId, ConnectError, Endpoint, PeerAddr};
use ibcm::sim::{App, SimNet};
use ibcm_mad::{Qpn, ServiceId};

use super::{IniEvent, TargetEvent, XrcInitiator, XrcTarget};

/// Called with each [`TargetEvent`] as it happens (virtual time).
pub type TargetObserver = Box<dyn FnMut(Instant, TargetEvent)>;

/// Called with each [`IniEvent`] as it happens (virtual time).
pub type IniObserver = Box<dyn FnMut(Instant, IniEvent)>;

type Slot<T> = Rc<RefCell<Option<T>>>;

fn drain_target(t: &mut XrcTarget, obs: &Slot<TargetObserver>, now: Instant) {
    if let Ok(mut o) = obs.try_borrow_mut() {
        if let Some(f) = o.as_mut() {
            while let Some(e) = t.poll_event() {
                f(now, e);
            }
        }
    }
}

fn drain_ini(i: &mut XrcInitiator, obs: &Slot<IniObserver>, now: Instant) {
    if let Ok(mut o) = obs.try_borrow_mut() {
        if let Some(f) = o.as_mut() {
            while let Some(e) = i.poll_event() {
                f(now, e);
            }
        }
    }
}
use ibcm_mad::xrc::XrcReqData;

/// An [`XrcTarget`] installed as a simulator node's application.
#[derive(Clone)]
pub struct SimTarget {
    node: usize,
    target: Rc<RefCell<XrcTarget>>,
    observer: Slot<TargetObserver>,
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
        Self::install_with(net, node, target, Box::new(|_, _, _| {}))
    }

    /// Installs `target` with `fallback` for the events it does not handle (non-XRC REQs,
    /// other connections of the node).
    ///
    /// # Panics
    /// If `node` is not a node of `net`.
    pub fn install_with(
        net: &mut SimNet,
        node: usize,
        target: XrcTarget,
        mut fallback: App,
    ) -> Self {
        let target = Rc::new(RefCell::new(target));
        let observer: Slot<TargetObserver> = Rc::new(RefCell::new(None));
        let (t, obs) = (target.clone(), observer.clone());
        net.set_app(
            node,
            Box::new(move |ep, now, ev| {
                let handled = match t.try_borrow_mut() {
                    Ok(mut x) => {
                        let h = x.handle_event(ep, now, ev);
                        drain_target(&mut x, &obs, now);
                        h
                    }
                    Err(_) => false,
                };
                if !handled {
                    fallback(ep, now, ev);
                }
            }),
        );
        Self {
            node,
            target,
            observer,
        }
    }

    /// Hands every [`TargetEvent`] to `f` as it happens, with its virtual time (instead of
    /// leaving them for [`XrcTarget::poll_event`]).
    pub fn set_observer(&self, f: TargetObserver) {
        *self.observer.borrow_mut() = Some(f);
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

    /// The target, mutably. Teardowns it causes are sent at the next [`SimTarget::with`] or
    /// [`SimTarget::run_until_time`]; prefer [`SimTarget::with`].
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
        drain_target(&mut t, &self.observer, now);
        r
    }

    /// Advances the simulation to `at`, firing the endpoints' timers, deliveries and the
    /// registry's quarantine timers in time order.
    ///
    /// # Panics
    /// If the target is borrowed.
    pub fn run_until_time(&self, net: &mut SimNet, at: Instant) {
        // Each round ends at least one quarantine; the bound only guards against a registry
        // that would not clear a due deadline.
        for _ in 0..100_000 {
            let next = self.target.borrow().poll_timeout();
            match next {
                Some(t) if t <= at => {
                    net.run_until_time(t);
                    let now = net.now();
                    self.with(net, |x, _, _| x.handle_timeout(now));
                    if self
                        .target
                        .borrow()
                        .poll_timeout()
                        .is_some_and(|n| n <= now)
                    {
                        break;
                    }
                }
                _ => break,
            }
        }
        net.run_until_time(at);
    }
}

/// An [`XrcInitiator`] installed as a simulator node's application.
#[derive(Clone)]
pub struct SimInitiator {
    node: usize,
    ini: Rc<RefCell<XrcInitiator>>,
    observer: Slot<IniObserver>,
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
        let ini = Rc::new(RefCell::new(XrcInitiator::new()));
        let observer: Slot<IniObserver> = Rc::new(RefCell::new(None));
        let (i, obs) = (ini.clone(), observer.clone());
        net.set_app(
            node,
            Box::new(move |ep, now, ev| {
                if let Ok(mut x) = i.try_borrow_mut() {
                    x.handle_event(ep, now, ev);
                    drain_ini(&mut x, &obs, now);
                }
            }),
        );
        Self {
            node,
            ini,
            observer,
        }
    }

    /// Hands every [`IniEvent`] to `f` as it happens, with its virtual time (instead of
    /// leaving them for [`XrcInitiator::poll_event`]).
    pub fn set_observer(&self, f: IniObserver) {
        *self.observer.borrow_mut() = Some(f);
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
        let now = net.now();
        let ep = net.endpoint(self.node);
        self.ini
            .borrow_mut()
            .connect(ep, now, peer, service_id, ini_qpn, data, &[])
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
        let now = net.now();
        let ep = net.endpoint(self.node);
        self.ini.borrow_mut().connect_with(ep, now, params)
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
