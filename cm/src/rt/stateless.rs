//! The async API of the stateless mode under pressure (docs/protocol.md §5.12):
//! [`Cm::listen_stateless`] and [`Listener::next_arrival`].

use ibcm_mad::ServiceId;
use tokio::sync::mpsc;

use super::command::Command;
use super::handle::{Cm, Connection, Incoming, Listener};
use super::types::{CmError, IncomingKind};
use crate::proto::{ConnId, ListenOptions, StatelessAccept, StatelessInfo};

/// What a stateless listener ([`Cm::listen_stateless`]) hands out next.
#[derive(Debug)]
pub enum Arrival {
    /// A request to answer, as [`Listener::next`] returns it (no pressure: the stateful path).
    Request(Incoming),
    /// A connection the endpoint answered statelessly and that its RTU established: the
    /// connection (ESTABLISHED) and what the REQ, the REP and the RTU said. Bring the QP up
    /// now (RTR and RTS), from [`StatelessInfo::req`] and [`StatelessInfo::rep`].
    Stateless(Connection, Box<StatelessInfo>),
}

impl Cm {
    /// [`Cm::listen`] with a stateless template: while the endpoint is under half-open
    /// pressure ([`EndpointConfig::stateless_threshold`], or always with
    /// [`EndpointConfig::stateless_always`]), the REQs for `service_id` are answered from
    /// `template` at once, without a connection entry and without asking the application; the
    /// connections their RTUs establish arrive on [`Listener::next_arrival`] as
    /// [`Arrival::Stateless`]. Without pressure, REQs arrive as usual ([`Arrival::Request`]).
    ///
    /// For listeners that accept every request alike: the application does not see the REQ
    /// before the REP goes out, and must bring its QP up from the REP's QPN and PSN when the
    /// connection arrives (docs/protocol.md §5.12 lists what else differs).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use ibcm::rt::{Arrival, Cm, MemNetwork};
    /// use ibcm::proto::{AcceptParams, ConnectParams, EndpointConfig, ListenOptions, StatelessAccept};
    /// use ibcm_mad::{Guid, Qpn, ServiceId};
    ///
    /// let net = MemNetwork::new();
    /// let a_addr = "127.0.0.1:4791".parse::<std::net::SocketAddr>().unwrap().into();
    /// let b_addr = "127.0.0.2:4791".parse::<std::net::SocketAddr>().unwrap().into();
    /// let (a, _) = Cm::bind(net.transport(a_addr), EndpointConfig::default());
    /// let (b, _) = Cm::bind(
    ///     net.transport(b_addr),
    ///     EndpointConfig { local_ca_guid: Guid(2), stateless_always: true, ..Default::default() },
    /// );
    /// let template = StatelessAccept::new(AcceptParams::new(Qpn::masked(0)), Qpn::masked(0x1000), 4096);
    /// let mut l = b
    ///     .listen_stateless(ServiceId(0x42), ListenOptions::default(), template)
    ///     .await
    ///     .unwrap();
    /// let conn = a
    ///     .connect(ConnectParams::new(b_addr, ServiceId(0x42), Qpn::new(0x11).unwrap()))
    ///     .await
    ///     .unwrap();
    /// let Some(Arrival::Stateless(passive, info)) = l.next_arrival().await else { panic!() };
    /// assert_eq!(info.req.remote_qpn(), Qpn::new(0x11).unwrap());
    /// assert_eq!(conn.rep().unwrap().rep.local_comm_id, passive.id());
    /// # }
    /// ```
    ///
    /// [`EndpointConfig::stateless_threshold`]: crate::proto::EndpointConfig::stateless_threshold
    /// [`EndpointConfig::stateless_always`]: crate::proto::EndpointConfig::stateless_always
    ///
    /// # Errors
    /// As [`Cm::listen`]; [`CmError::Call`] for a template the endpoint refuses (REP private
    /// data over 196 bytes). Through the node service ([`Cm::attach`]) the daemon's endpoint
    /// answers statelessly at its own threshold; [`CmError::Refused`] if the daemon refuses
    /// the listen (another client listens there, a quota, a template its endpoint refuses).
    pub async fn listen_stateless(
        &self,
        service_id: ServiceId,
        options: ListenOptions,
        template: StatelessAccept,
    ) -> Result<Listener, CmError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let (stx, srx) = mpsc::unbounded_channel();
        let token = self
            .call(|reply| Command::ListenStateless {
                service_id,
                options,
                template,
                tx,
                stateless: stx,
                reply,
            })
            .await??;
        Ok(Listener {
            rx,
            cm: self.clone(),
            service_id,
            token,
            stateless: Some(srx),
        })
    }
}

/// What one wait of [`Listener::next_arrival`] got.
enum Got {
    Stateless(Option<(ConnId, Box<StatelessInfo>)>),
    Request(Option<(ConnId, IncomingKind)>),
}

impl Listener {
    /// The next request or statelessly established connection; `None` when the endpoint
    /// stopped. Stateless connections come first when both are ready. On a listener made with
    /// [`Cm::listen`] this is [`Listener::next`].
    pub async fn next_arrival(&mut self) -> Option<Arrival> {
        loop {
            let got = match self.stateless.as_mut() {
                Some(srx) => tokio::select! {
                    biased;
                    s = srx.recv() => Got::Stateless(s),
                    r = self.rx.recv() => Got::Request(r),
                },
                None => Got::Request(self.rx.recv().await),
            };
            match got {
                Got::Stateless(Some((id, info))) => {
                    // A connection that left the table already (closed and out of
                    // TimeWait before the application looked) is skipped.
                    if let Some(c) = self.cm.connection(id) {
                        return Some(Arrival::Stateless(c, info));
                    }
                }
                Got::Stateless(None) => self.stateless = None,
                Got::Request(None) => return None,
                Got::Request(Some((id, kind))) => {
                    if matches!(kind, IncomingKind::Connect(_)) && self.cm.slot(id).is_none() {
                        continue;
                    }
                    return Some(Arrival::Request(Incoming::new(id, self.cm.clone(), kind)));
                }
            }
        }
    }
}
