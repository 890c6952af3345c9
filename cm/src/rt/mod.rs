//! The tokio runtime around the sans-IO core (feature `rt`, on by default).
//!
//! One task ([`Cm::bind`]) owns a [`proto::Endpoint`](crate::proto::Endpoint) and a
//! [`DatagramTransport`]; cloneable [`Cm`] handles talk to it over a channel. The task sleeps
//! on one timer, re-armed only when the endpoint's next deadline changes, and reads the clock
//! through tokio (so `#[tokio::test(start_paused = true)]` tests run in virtual time).
//!
//! [`Cm::bind_with_app`] runs an [`App`](crate::App) in that task too: it sees every event
//! with `&mut Endpoint`, and its deadlines are folded into the one timer
//! ([`crate::App`]: call order); [`Cm::with_app`] reaches it from async code.
//!
//! Path migration (LAP/APR): [`Connection::load_alt_path`] sends a LAP; the LAPs that arrive
//! are answered "unsupported" by the driver unless [`Cm::set_lap_policy`] hands them to the
//! application ([`LapPolicy`], [`Connection::next_lap`], [`LapRequest`]).
//!
//! Transports: [`MemNetwork`]/[`MemTransport`] (in-process), [`UdpTransport`] (RoCEv2 over a
//! UDP socket) and [`UmadTransport`] (Linux `/dev/infiniband/umadN`).
//!
//! The task works in turns: it waits for one input, takes whatever else is ready without
//! waiting (the commands queued, the datagrams one receive returns:
//! [`DatagramTransport::recv_batch`] / [`DatagramTransport::try_recv_batch`]), handles each,
//! and then sends everything the turn produced with one [`DatagramTransport::send_batch`].
//! [`UdpTransport`] moves up to 64 datagrams per `recvmmsg`/`sendmmsg`; [`UmadTransport`]
//! one MAD per `read`/`write` (the umad device has no batched calls; the
//! [`umad`] module docs say why).

mod command;
mod driver;
mod handle;
mod lap;
mod neigh;
pub mod node;
mod pending;
pub mod sa;
mod slot;
mod stateless;
mod stats;
mod sys;
mod transport;
mod types;
pub mod udp;
pub mod umad;

/// The driver's clock (tokio's, so that paused-time tests move it) as the core's `Instant`.
fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

/// Sleeps on the driver's clock until `t` (never returns for `None`).
async fn sleep_until(t: Option<std::time::Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(tokio::time::Instant::from_std(t)).await,
        None => std::future::pending().await,
    }
}

pub use driver::SHUTDOWN_LINGER;
pub use handle::{Cm, Connection, Incoming, Listener};
pub use lap::LapRequest;
pub use pending::PendingConnection;
pub use stateless::Arrival;
pub use stats::{CmStats, TransportStats};
pub use transport::{DatagramTransport, MemNetwork, MemTransport};
pub use types::{AprAnswer, CmError, ConnStatus, IncomingKind, LapPolicy, SidrAnswer};
pub use udp::{DataPacket, IcrcPolicy, UdpStats, UdpTransport};
pub use umad::{UmadError, UmadHdr, UmadTransport};
