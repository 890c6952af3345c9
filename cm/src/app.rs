//! [`App`]: an application run next to an endpoint (its docs: the call order).

#[cfg(any(feature = "rt", feature = "sim"))]
use std::any::Any;
use std::time::Instant;

use crate::proto::{Endpoint, Event};

/// An application object run next to an [`Endpoint`] by the simulator
/// (`sim::SimNet`, feature `sim`) and by the tokio driver
/// (`rt::Cm::bind_with_app`, feature `rt`).
///
/// An application sees every event of its endpoint together with `&mut Endpoint` (so it can
/// accept, reject, disconnect… at once, with the connection's real ID), may do deferred work
/// after each input ([`App::poll`]) and has its own timers ([`App::poll_timeout`] /
/// [`App::handle_timeout`]), which the host folds into its one timer.
///
/// # Call order
///
/// The host (simulator or driver) runs, after each input — a datagram, a timer expiry, a
/// command from a handle, or a call of `SimNet::with_app` / `Cm::with_app`:
///
/// 1. the input itself: `Endpoint::handle_datagram`, or for a timer `Endpoint::handle_timeout`
///    (if the endpoint's deadline is due) then [`App::handle_timeout`] (if the app's deadline is
///    due), or the command / closure;
/// 2. **events**: each `Endpoint::poll_event`, in order, goes to [`App::handle_event`]; what the
///    app does not consume goes on to the host (the driver's handles; the simulator records
///    every event either way);
/// 3. **app**: [`App::poll`] once the events are out;
/// 4. 2–3 again while the app's calls produced events;
/// 5. **transmit**: every `Endpoint::poll_transmit` goes on the wire (the simulator also moves
///    MADs queued before step 2 first; one endpoint's order is the same, its queue is FIFO);
/// 6. **timers**: the host's one timer is re-armed at the earlier of `Endpoint::poll_timeout`
///    and [`App::poll_timeout`].
///
/// The tokio driver runs steps 1–4 for every input, but steps 5–6 once per *turn*: the inputs
/// that are ready together (the commands waiting, the datagrams one receive returned) each get
/// steps 1–4, then what they all queued goes out at once, in order (over UDP, 64 MADs per
/// `sendmmsg`).
///
/// So an application never needs a timer task, a lock or a channel of its own.
///
/// A closure `FnMut(&mut Endpoint, Instant, &Event)` is an `App` (it consumes nothing, has no
/// timers):
///
/// ```
/// use ibcm::proto::{Endpoint, EndpointConfig, Event, EventKind};
/// use ibcm::App;
/// use std::time::Instant;
///
/// fn takes(app: impl App) {}
/// takes(|ep: &mut Endpoint, now: Instant, ev: &Event| {
///     if let EventKind::Established = ev.kind {
///         let _ = ep.disconnect(now, ev.conn, &[]);
///     }
/// });
/// ```
pub trait App {
    /// One event of `ep`, at `now`. Returns whether the app consumed it: the tokio driver does
    /// not hand a consumed event to its handles (for a REQ: no `Listener` sees it, no
    /// `Connection` handle exists for it, and its later events go to the app alone). The
    /// simulator records every event either way.
    fn handle_event(&mut self, ep: &mut Endpoint, now: Instant, event: &Event) -> bool;

    /// Deferred work once the events of an input are out (e.g. DREQs for connections whose
    /// resources went away during a `rt::Cm::with_app` call). May be called more than
    /// once per input; must do nothing when there is nothing to do. Default: nothing.
    fn poll(&mut self, ep: &mut Endpoint, now: Instant) {
        let _ = (ep, now);
    }

    /// When [`App::handle_timeout`] must next be called; `None`: no timer. Default: `None`.
    fn poll_timeout(&self) -> Option<Instant> {
        None
    }

    /// Fires the app's timers due at `now` (called at, never before, [`App::poll_timeout`]).
    /// Default: nothing.
    fn handle_timeout(&mut self, ep: &mut Endpoint, now: Instant) {
        let _ = (ep, now);
    }
}

/// Any closure over the events: called for each one, consumes none, no timers.
impl<F> App for F
where
    F: FnMut(&mut Endpoint, Instant, &Event),
{
    fn handle_event(&mut self, ep: &mut Endpoint, now: Instant, event: &Event) -> bool {
        self(ep, now, event);
        false
    }
}

/// An [`App`] the host can hand back by its concrete type.
#[cfg(any(feature = "rt", feature = "sim"))]
pub(crate) trait DynApp: App + Any {
    fn as_any_mut(&mut self) -> &mut dyn Any;
    #[cfg(feature = "sim")]
    fn as_any(&self) -> &dyn Any;
}

#[cfg(any(feature = "rt", feature = "sim"))]
impl<T: App + Any> DynApp for T {
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
    #[cfg(feature = "sim")]
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The timer input of the call order (step 1 of [`App`]'s docs), for the simulator and the
/// driver alike: the endpoint's timers, then the app's, each only if due at `now`.
#[cfg(any(feature = "rt", feature = "sim"))]
pub(crate) fn fire_timers<A: App + ?Sized>(ep: &mut Endpoint, app: Option<&mut A>, now: Instant) {
    if due(ep.poll_timeout(), now) {
        ep.handle_timeout(now);
    }
    if let Some(app) = app {
        if due(app.poll_timeout(), now) {
            app.handle_timeout(ep, now);
        }
    }
}

/// Whether `at` is due at `now`.
#[cfg(any(feature = "rt", feature = "sim"))]
pub(crate) fn due(at: Option<Instant>, now: Instant) -> bool {
    at.is_some_and(|t| t <= now)
}

/// The earlier of two deadlines.
#[cfg(any(feature = "rt", feature = "sim"))]
pub(crate) fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
