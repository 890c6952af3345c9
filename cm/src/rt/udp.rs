//! RoCEv2 over a UDP socket: a software GSI (QP1) endpoint.
//!
//! Each MAD travels as the UDP payload "BTH (opcode 0x64 UD SEND Only, P_Key 0xFFFF, DestQP 1),
//! DETH (Q_Key 0x8001_0000, SrcQP 1), MAD, ICRC" to UDP port 4791, exactly as rxe or a RoCE NIC
//! sends it; peers are named by IP address (GID `::ffff:a.b.c.d`).
//!
//! # The ICRC and the IPv4 header
//! The ICRC covers the IPv4 header except TOS, TTL and checksum (docs/framing.md §2.2), so the
//! sender must know the header the kernel will write. This transport makes it predictable:
//! the socket is **unconnected** and has `IP_MTU_DISCOVER = IP_PMTUDISC_DO`, so Linux sets DF
//! and — for a DF datagram on an unconnected socket — IP ID **0** (`ip_select_ident_segs`;
//! verified on the build machine: three datagrams from an unconnected DF socket all carried ID
//! 0, while a connected socket counts up from a random value). Total length, protocol and the
//! addresses follow from the datagram; the IHL is 5 (no options). The receiver checks the ICRC
//! under the same assumption, using the source address and port `recvfrom` reports.
//!
//! A peer that sends with another IP ID (rxe draws a per-destination ID) cannot be checked
//! this way without the IP header; [`IcrcPolicy::Lenient`] accepts such MADs and counts
//! them in [`UdpStats::icrc_unverified`]. IPv6 has no ID field and is always checkable.
//!
//! # Packets for other QPs
//! A RoCEv2 packet for a QP other than QP1 is not a MAD: it is dropped (`not_mad`), or, with
//! [`UdpTransport::with_data_sink`], handed whole (BTH and what follows) to the sink once its
//! ICRC is checked as a MAD's would be — the data path of a software device (`ibcmd
//! --backend sim` receives XRC SENDs this way).
//!
//! # IPv6 and the UDP checksum
//! rxe sends RoCEv2 over IPv6 with UDP checksum 0 (the ICRC protects the packet), which Linux
//! drops on an IPv6 socket unless `UDP_NO_CHECK6_RX` is set (RFC 6935 allows checksum 0 for tunnels);
//! an IPv6 socket of this transport sets it, so the ICRC alone checks what arrives (the
//! conformance lab's `udp-*-ipv6` cells).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use ibcm_mad::frame::{
    bth, deth, icrc, udp, BthRepr, IpRepr, Opcode, RoceV2UdRepr, ROCEV2_UDP_PORT,
};
use ibcm_mad::{Psn, MAD_LEN};
use tokio::io::Interest;
use tokio::net::UdpSocket;
use tokio::sync::mpsc;

use super::sys::{self, MMSG_BATCH};
use super::{DatagramTransport, TransportStats};
use crate::proto::{PeerAddr, Transmit};

/// What to do with a received datagram whose ICRC does not match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IcrcPolicy {
    /// Drop it (counted in [`UdpStats::icrc_bad`]). For peers that send like this transport
    /// (IPv4 ID 0) or over IPv6.
    #[default]
    Strict,
    /// Accept it (counted in [`UdpStats::icrc_unverified`]): for peers whose IPv4 ID cannot be
    /// known, such as rxe.
    Lenient,
}

/// Counters of a [`UdpTransport`].
#[derive(Debug, Default)]
pub struct UdpStats {
    /// Datagrams received.
    pub rx: AtomicU64,
    /// Datagrams sent.
    pub tx: AtomicU64,
    /// Dropped: not RoCEv2 / not a UD MAD to QP1 / truncated.
    pub not_mad: AtomicU64,
    /// Dropped: bad ICRC (strict policy).
    pub icrc_bad: AtomicU64,
    /// Accepted although the ICRC did not match (lenient policy).
    pub icrc_unverified: AtomicU64,
    /// Receive system calls that returned datagrams (`rx / recv_calls`: datagrams per call).
    pub recv_calls: AtomicU64,
    /// Send system calls that sent datagrams (`tx / send_calls`: datagrams per call).
    pub send_calls: AtomicU64,
    /// RoCEv2 packets for a QP other than QP1 (the data path) handed to the data sink
    /// ([`UdpTransport::with_data_sink`]).
    pub data: AtomicU64,
    /// Dropped: data-path packets with no sink, or a sink that was full.
    pub data_dropped: AtomicU64,
}

/// The RoCEv2/UDP transport.
#[derive(Debug)]
pub struct UdpTransport {
    sock: UdpSocket,
    local: SocketAddr,
    psn: u32,
    policy: IcrcPolicy,
    stats: Arc<UdpStats>,
    /// Receive buffers, one per datagram of a `recvmmsg`.
    rx_bufs: Box<[[u8; RECV_LEN]]>,
    /// What `recvmmsg` said about each.
    rx_meta: Box<[sys::Received; MMSG_BATCH]>,
    /// The received MADs handed out, one slice each: a buffer shared by a batch's MADs, whose
    /// room is reused once the driver has dropped them all (no allocation per MAD).
    rx_mads: BytesMut,
    /// Encoded datagrams, one per datagram of a `sendmmsg`.
    tx_bufs: Box<[[u8; SEND_LEN]]>,
    /// For each of `tx_bufs`: the index of its MAD in the batch, destination and length.
    tx_meta: Vec<(usize, SocketAddr, usize)>,
    /// Where RoCEv2 packets that are not MADs go ([`UdpTransport::with_data_sink`]).
    data_sink: Option<mpsc::Sender<DataPacket>>,
}

/// A RoCEv2 packet for a QP other than QP1, received on the CM's port (4791): the data path
/// of a software device (the `sim` backend of the node service), its ICRC checked as a
/// MAD's is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataPacket {
    /// Its source.
    pub from: SocketAddr,
    /// Its BTH.
    pub bth: BthRepr,
    /// What follows the BTH: extension headers and payload, without pad and ICRC.
    pub body: Bytes,
}

/// Room for one received datagram (a RoCEv2 GSI datagram is 280 bytes; longer ones are
/// read up to here, shorter ones whole).
const RECV_LEN: usize = 2048;
/// Room for one encoded datagram.
const SEND_LEN: usize = 512;

impl UdpTransport {
    /// Binds to `ip`:4791.
    ///
    /// # Errors
    /// Socket errors (address in use, no such address, …).
    pub async fn bind(ip: IpAddr) -> io::Result<Self> {
        Self::bind_port(SocketAddr::new(ip, ROCEV2_UDP_PORT)).await
    }

    /// Binds to an explicit address (a port other than 4791 is for tests only: real RoCE
    /// peers always send to 4791).
    ///
    /// # Errors
    /// Socket errors.
    pub async fn bind_port(addr: SocketAddr) -> io::Result<Self> {
        let domain = if addr.is_ipv4() {
            socket2::Domain::IPV4
        } else {
            socket2::Domain::IPV6
        };
        let s = socket2::Socket::new(domain, socket2::Type::DGRAM, Some(socket2::Protocol::UDP))?;
        if addr.is_ipv4() {
            sys::set_pmtudisc_do(&s)?;
        } else {
            sys::set_udp_no_check6_rx(&s)?;
        }
        s.set_nonblocking(true)?;
        s.set_recv_buffer_size(4 << 20).ok();
        s.set_send_buffer_size(4 << 20).ok();
        s.bind(&addr.into())?;
        let std_sock: std::net::UdpSocket = s.into();
        let sock = UdpSocket::from_std(std_sock)?;
        let local = sock.local_addr()?;
        Ok(UdpTransport {
            sock,
            local,
            psn: 0,
            policy: IcrcPolicy::Strict,
            stats: Arc::new(UdpStats::default()),
            rx_bufs: vec![[0; RECV_LEN]; MMSG_BATCH].into_boxed_slice(),
            rx_meta: Box::new(
                [sys::Received {
                    len: 0,
                    from: None,
                    truncated: false,
                }; MMSG_BATCH],
            ),
            rx_mads: BytesMut::new(),
            tx_bufs: vec![[0; SEND_LEN]; MMSG_BATCH].into_boxed_slice(),
            tx_meta: Vec::with_capacity(MMSG_BATCH),
            data_sink: None,
        })
    }

    /// Hands the RoCEv2 packets for QPs other than QP1 that pass the ICRC check (under the
    /// transport's [`IcrcPolicy`]) to `sink` instead of dropping them as
    /// [`UdpStats::not_mad`]; when `sink` is full they are dropped and counted in
    /// [`UdpStats::data_dropped`].
    pub fn with_data_sink(mut self, sink: mpsc::Sender<DataPacket>) -> Self {
        self.data_sink = Some(sink);
        self
    }

    /// Sends one RoCEv2 UDP payload that the caller built (e.g. with
    /// [`RoceV2XrcSendRepr`](ibcm_mad::frame::RoceV2XrcSendRepr), its ICRC over this
    /// socket's address: IPv4 ID 0 and DF, as for MADs) to `to`.
    ///
    /// # Errors
    /// Socket errors.
    pub async fn send_datagram(&self, to: SocketAddr, udp_payload: &[u8]) -> io::Result<()> {
        self.sock.send_to(udp_payload, to).await?;
        self.stats.tx.fetch_add(1, Ordering::Relaxed);
        self.stats.send_calls.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Sets the ICRC policy for received datagrams.
    pub fn with_icrc_policy(mut self, policy: IcrcPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Counters (shared; they keep counting after the transport moved into a driver).
    pub fn stats(&self) -> Arc<UdpStats> {
        self.stats.clone()
    }

    /// The bound socket address.
    pub fn socket_addr(&self) -> SocketAddr {
        self.local
    }

    /// Builds the UDP payload for `mad` to `to` into send buffer `slot`; returns its length.
    fn encode(&mut self, to: PeerAddr, mad: &[u8], slot: usize) -> io::Result<(SocketAddr, usize)> {
        let PeerAddr::Udp(to) = to else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the UDP transport needs a UDP peer address",
            ));
        };
        let psn = Psn::masked(self.psn);
        self.psn = self.psn.wrapping_add(1);
        let repr = RoceV2UdRepr::gsi(self.local.ip(), to.ip(), 0, self.local.port(), psn)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let mut repr = repr;
        repr.udp.dst_port = to.port();
        let out = self
            .tx_bufs
            .get_mut(slot)
            .ok_or_else(|| io::Error::other("send slot out of range"))?;
        let n = repr
            .emit_udp_payload(mad, &mut out[..])
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        Ok((to, n))
    }

    /// Decodes the first `n` datagrams of the receive buffers into `out`, counting them and
    /// what is dropped.
    fn take_received(&mut self, n: usize, out: &mut Vec<(PeerAddr, Bytes)>) {
        let mads = &mut self.rx_mads;
        // Room for the whole batch: reclaimed in place when the last batch's MADs are gone.
        mads.reserve(n.min(MMSG_BATCH) * MAD_LEN);
        for (meta, buf) in self.rx_meta.iter().zip(self.rx_bufs.iter()).take(n) {
            self.stats.rx.fetch_add(1, Ordering::Relaxed);
            let payload = buf.get(..meta.len).unwrap_or(&[]);
            let decoded = match meta.from {
                Some(from) if !meta.truncated => {
                    decode(payload, from, self.local).map(|(d, ok)| (from, d, ok))
                }
                _ => None,
            };
            let sink = self.data_sink.as_ref();
            if let Some((from, mad)) = accept(decoded, self.policy, &self.stats, self.local, sink) {
                mads.extend_from_slice(mad);
                out.push((from, mads.split().freeze()));
            }
        }
    }

    /// One `recvmmsg` without waiting, decoded into `out`. `WouldBlock` if nothing was there.
    ///
    /// A call that returns fewer datagrams than it asked for emptied the socket's queue
    /// (`MSG_DONTWAIT`): the reactor's readiness is cleared then too, as after `EAGAIN`, so
    /// that the next wait sleeps until a datagram arrives instead of spending a system call to
    /// find the queue empty (one per driver turn before: ~2 of every 3 `recvmmsg` calls in
    /// `cm-bench rate`). tokio clears it only if no readiness event came during the call.
    fn recv_ready(&mut self, out: &mut Vec<(PeerAddr, Bytes)>) -> io::Result<()> {
        let (sock, bufs, meta) = (&self.sock, &mut self.rx_bufs, &mut self.rx_meta);
        let want = bufs.len().min(MMSG_BATCH);
        let mut got = 0;
        let r = sock.try_io(Interest::READABLE, || {
            got = sys::recv_mmsg(sock, bufs, meta)?;
            if got < want {
                Err(io::ErrorKind::WouldBlock.into())
            } else {
                Ok(())
            }
        });
        match r {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && got > 0 => {}
            r => r?,
        }
        self.stats.recv_calls.fetch_add(1, Ordering::Relaxed);
        self.take_received(got, out);
        Ok(())
    }
}

/// A decoded datagram (source, content, whether the ICRC matched) → the MAD the endpoint
/// gets, per the ICRC policy; a data packet goes to `sink` (none: it is "not a MAD"); counts
/// what is dropped or handed over.
fn accept<'a>(
    decoded: Option<(SocketAddr, Decoded<'a>, bool)>,
    policy: IcrcPolicy,
    stats: &UdpStats,
    local: SocketAddr,
    sink: Option<&mpsc::Sender<DataPacket>>,
) -> Option<(PeerAddr, &'a [u8])> {
    let taken = |(_, d, _): &(SocketAddr, Decoded<'_>, bool)| {
        matches!(d, Decoded::Mad(_)) || sink.is_some()
    };
    let Some((from, d, icrc_ok)) = decoded.filter(taken) else {
        stats.not_mad.fetch_add(1, Ordering::Relaxed);
        return None;
    };
    if !icrc_ok {
        match policy {
            IcrcPolicy::Strict => {
                stats.icrc_bad.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            IcrcPolicy::Lenient => {
                stats.icrc_unverified.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    match d {
        Decoded::Mad(mad) => {
            // Replies always go to the RoCEv2 port, whatever the source port was.
            let peer = SocketAddr::new(from.ip(), reply_port(from, local));
            Some((PeerAddr::Udp(peer), mad))
        }
        Decoded::Data(bth, body) => {
            let p = DataPacket {
                from,
                bth,
                body: Bytes::copy_from_slice(body),
            };
            let handed = sink.is_some_and(|s| s.try_send(p).is_ok());
            let counter = if handed {
                &stats.data
            } else {
                &stats.data_dropped
            };
            counter.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// Length of BTH + DETH.
const TRANSPORT_HEADERS: usize = bth::HEADER_LEN + deth::HEADER_LEN;

/// A received UDP payload, decoded.
enum Decoded<'a> {
    /// A UD MAD for QP1.
    Mad(&'a [u8]),
    /// A packet for another QP: its BTH and what follows it (no pad, no ICRC).
    Data(BthRepr, &'a [u8]),
}

/// Decodes a received UDP payload (BTH .. ICRC) that came from `from` to `local`. The ICRC is
/// checked over an IP header rebuilt as this transport's sender writes it (IPv4 ID 0, DF).
/// Returns the MAD (or the data packet) and whether the ICRC matched, or `None` if it is
/// neither a UD MAD for QP1 nor a well-formed packet for another QP.
fn decode(payload: &[u8], from: SocketAddr, local: SocketAddr) -> Option<(Decoded<'_>, bool)> {
    let bth_bytes = payload.get(..bth::HEADER_LEN)?;
    let bth = BthRepr::parse(&bth::Packet::new_checked(bth_bytes).ok()?).ok()?;
    let pad = usize::from(bth.pad_count.get());
    let icrc_at = payload.len().checked_sub(4)?;
    let decoded = if bth.opcode == Opcode::UD_SEND_ONLY && bth.dest_qp.get() <= 1 {
        let mad = payload.get(TRANSPORT_HEADERS..TRANSPORT_HEADERS + MAD_LEN)?;
        if icrc_at < TRANSPORT_HEADERS + MAD_LEN + pad {
            return None;
        }
        Decoded::Mad(mad)
    } else if bth.dest_qp.get() > 1 {
        Decoded::Data(
            bth,
            payload.get(bth::HEADER_LEN..icrc_at.checked_sub(pad)?)?,
        )
    } else {
        return None;
    };
    let found = u32::from_le_bytes(*payload.get(icrc_at..)?.first_chunk::<4>()?);
    let mut repr = RoceV2UdRepr::gsi(from.ip(), local.ip(), 0, from.port(), Psn::default()).ok()?;
    repr.udp.dst_port = local.port();
    repr.udp.payload_len = payload.len();
    let mut hdr = [0u8; 48];
    let ip_len = repr.ip.buffer_len();
    match &mut repr.ip {
        IpRepr::V4(r) => r.payload_len = udp::HEADER_LEN + payload.len(),
        IpRepr::V6(r) => r.payload_len = udp::HEADER_LEN + payload.len(),
    }
    repr.ip.emit(hdr.get_mut(..ip_len)?);
    repr.udp.emit(&mut udp::Packet::new_unchecked(
        hdr.get_mut(ip_len..ip_len + udp::HEADER_LEN)?,
    ));
    let expected = icrc::icrc_rocev2(
        hdr.get(..ip_len + udp::HEADER_LEN)?,
        payload.get(..icrc_at)?,
    )
    .ok()?;
    let ok = cfg!(fuzzing) || expected == found;
    Some((decoded, ok))
}

impl DatagramTransport for UdpTransport {
    async fn send(&mut self, to: PeerAddr, mad: &[u8]) -> io::Result<()> {
        let (to, n) = self.encode(to, mad, 0)?;
        let out = self.tx_bufs.first().and_then(|b| b.get(..n)).unwrap_or(&[]);
        self.sock.send_to(out, to).await?;
        self.stats.tx.fetch_add(1, Ordering::Relaxed);
        self.stats.send_calls.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    async fn recv(&mut self) -> io::Result<(PeerAddr, Bytes)> {
        loop {
            let Some(buf) = self.rx_bufs.first_mut() else {
                return Err(io::Error::other("no receive buffer"));
            };
            let (len, from) = self.sock.recv_from(&mut buf[..]).await?;
            self.stats.rx.fetch_add(1, Ordering::Relaxed);
            self.stats.recv_calls.fetch_add(1, Ordering::Relaxed);
            let payload = buf.get(..len).unwrap_or(&[]);
            let decoded = decode(payload, from, self.local).map(|(d, ok)| (from, d, ok));
            let sink = self.data_sink.as_ref();
            if let Some((from, mad)) = accept(decoded, self.policy, &self.stats, self.local, sink) {
                return Ok((from, Bytes::copy_from_slice(mad)));
            }
        }
    }

    /// Up to 64 datagrams per `recvmmsg`.
    async fn recv_batch(&mut self, out: &mut Vec<(PeerAddr, Bytes)>) -> io::Result<()> {
        let before = out.len();
        loop {
            // Readiness first, then one non-blocking call: cancelling between the two takes
            // nothing from the socket.
            self.sock.readable().await?;
            match self.recv_ready(out) {
                Ok(()) if out.len() > before => return Ok(()),
                // Only datagrams that were dropped: wait for more.
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// One `recvmmsg` if the reactor has seen the socket readable since the last call that
    /// found it empty; none otherwise (the driver calls this after every turn: most found
    /// nothing, one system call each, ~3 per 10 MADs in `cm-bench rate`). What arrives
    /// meanwhile wakes [`recv_batch`](DatagramTransport::recv_batch) as always.
    fn try_recv_batch(&mut self, out: &mut Vec<(PeerAddr, Bytes)>) -> io::Result<()> {
        // The noop waker takes the socket's poll-slot waker only; `recv_batch` waits through
        // `readable()`, whose waiters are kept apart.
        let mut cx = Context::from_waker(Waker::noop());
        match self.sock.poll_recv_ready(&mut cx) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(e)) => return Err(e),
            Poll::Pending => return Ok(()),
        }
        match self.recv_ready(out) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            r => r,
        }
    }

    /// Up to 64 datagrams per `sendmmsg`; waits for room when the socket's send buffer is
    /// full.
    async fn send_batch(&mut self, mads: &[Transmit]) -> Vec<(usize, io::Error)> {
        let mut failed = Vec::new();
        // Taken out of `self` while `self.encode` needs `&mut self`; put back at the end.
        let mut chunk = std::mem::take(&mut self.tx_meta);
        let mut next = mads.iter().enumerate().peekable();
        while next.peek().is_some() {
            // Encode up to one batch (a MAD that cannot be encoded fails alone).
            chunk.clear();
            while chunk.len() < MMSG_BATCH {
                let Some((i, t)) = next.next() else { break };
                match self.encode(t.to, &t.mad, chunk.len()) {
                    Ok((to, n)) => chunk.push((i, to, n)),
                    Err(e) => failed.push((i, e)),
                }
            }
            let mut sent = 0;
            while sent < chunk.len() {
                let (sock, bufs) = (&self.sock, &self.tx_bufs);
                let rest = chunk
                    .iter()
                    .zip(bufs.iter())
                    .skip(sent)
                    .map(|(&(_, to, n), buf)| (to, buf.get(..n).unwrap_or(&[])));
                match sock.try_io(Interest::WRITABLE, || sys::send_mmsg(sock, rest)) {
                    Ok(0) => {
                        // `sendmmsg` sends at least one or fails; should it not, skip that one
                        // rather than spin.
                        if let Some(&(i, ..)) = chunk.get(sent) {
                            failed.push((i, io::Error::other("sendmmsg sent nothing")));
                        }
                        sent += 1;
                    }
                    Ok(m) => {
                        self.stats.tx.fetch_add(m as u64, Ordering::Relaxed);
                        self.stats.send_calls.fetch_add(1, Ordering::Relaxed);
                        sent += m;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        if let Err(e) = self.sock.writable().await {
                            let kind = e.kind();
                            for &(i, ..) in chunk.get(sent..).unwrap_or(&[]) {
                                failed.push((i, io::Error::new(kind, e.to_string())));
                            }
                            break;
                        }
                    }
                    // The first datagram of `rest` failed (sent alone, it says why).
                    Err(e) => {
                        if let Some(&(i, ..)) = chunk.get(sent) {
                            failed.push((i, e));
                        }
                        sent += 1;
                    }
                }
            }
        }
        chunk.clear();
        self.tx_meta = chunk;
        // Encoding failures were noted before the send failures of the same batch.
        failed.sort_by_key(|&(i, _)| i);
        failed
    }

    fn local_addr(&self) -> PeerAddr {
        PeerAddr::Udp(self.local)
    }

    fn stats(&self) -> TransportStats {
        let s = &self.stats;
        TransportStats {
            rx: s.rx.load(Ordering::Relaxed),
            tx: s.tx.load(Ordering::Relaxed),
            dropped: vec![
                ("bad_icrc", s.icrc_bad.load(Ordering::Relaxed)),
                ("not_mad", s.not_mad.load(Ordering::Relaxed)),
                ("data_dropped", s.data_dropped.load(Ordering::Relaxed)),
            ],
            other: vec![
                ("icrc_unverified", s.icrc_unverified.load(Ordering::Relaxed)),
                ("recv_calls", s.recv_calls.load(Ordering::Relaxed)),
                ("send_calls", s.send_calls.load(Ordering::Relaxed)),
                ("data", s.data.load(Ordering::Relaxed)),
            ],
        }
    }
}

/// The port to answer to: 4791 for real RoCE peers (whose source port is an entropy value);
/// when this transport itself is bound to another port (tests), the peer's source port.
fn reply_port(from: SocketAddr, local: SocketAddr) -> u16 {
    if local.port() == ROCEV2_UDP_PORT {
        ROCEV2_UDP_PORT
    } else {
        from.port()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two transports bound to ephemeral ports of `ip` (`127.0.0.1` or `[::1]`).
    async fn pair(ip: &str) -> (UdpTransport, UdpTransport) {
        let at = format!("{ip}:0").parse().unwrap();
        let a = UdpTransport::bind_port(at).await.unwrap();
        let b = UdpTransport::bind_port(at).await.unwrap();
        (a, b)
    }

    #[tokio::test]
    async fn loopback_round_trip_with_icrc() {
        let (mut a, mut b) = pair("127.0.0.1").await;
        let mad = [0x5au8; 256];
        a.send(b.local_addr(), &mad).await.unwrap();
        let (from, got) = b.recv().await.unwrap();
        assert_eq!(from, a.local_addr());
        assert_eq!(&got[..], &mad[..]);
        assert_eq!(b.stats().icrc_bad.load(Ordering::Relaxed), 0);
        // A wrong-ICRC datagram is dropped under the strict policy.
        let raw = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let (_, n) = a.encode(b.local_addr(), &mad, 0).unwrap();
        let mut bad = a.tx_bufs[0][..n].to_vec();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        raw.send_to(&bad, b.socket_addr()).unwrap();
        a.send(b.local_addr(), &mad).await.unwrap();
        let (from, _) = b.recv().await.unwrap();
        assert_eq!(from, a.local_addr());
        assert_eq!(b.stats().icrc_bad.load(Ordering::Relaxed), 1);
    }

    /// An XRC SEND Only from `a` to TGT QP 0x4a at `b`, for SRQ 0x10, as a UDP payload.
    fn xrc_send(a: &UdpTransport, b: &UdpTransport, psn: u32, payload: &[u8]) -> Vec<u8> {
        use ibcm_mad::frame::RoceV2XrcSendRepr;
        use ibcm_mad::xrc::SrqNum;
        let (src, dst) = (a.socket_addr(), b.socket_addr());
        let mut r = RoceV2XrcSendRepr::send_only(
            src.ip(),
            dst.ip(),
            src.port(),
            ibcm_mad::Qpn::masked(0x4a),
            Psn::masked(psn),
            SrqNum::masked(0x10),
        )
        .unwrap();
        r.udp.dst_port = dst.port();
        let mut out = vec![0u8; r.udp_payload_len(payload.len())];
        let n = r.emit_udp_payload(payload, &mut out).unwrap();
        out.truncate(n);
        out
    }

    #[tokio::test]
    async fn data_packets_go_to_the_sink_with_their_icrc_checked_and_mads_still_arrive() {
        let (a, b) = pair("127.0.0.1").await;
        let (tx, mut rx) = mpsc::channel(1);
        let mut b = b.with_data_sink(tx);
        let to = b.socket_addr();
        a.send_datagram(to, &xrc_send(&a, &b, 7, b"hello"))
            .await
            .unwrap();
        // a bad ICRC is dropped as a MAD's is
        let mut bad = xrc_send(&a, &b, 8, b"x");
        let last = bad.len() - 1;
        bad[last] ^= 1;
        a.send_datagram(to, &bad).await.unwrap();
        // the sink holds one: the next is dropped and counted
        a.send_datagram(to, &xrc_send(&a, &b, 9, b"y"))
            .await
            .unwrap();
        let mut a = a;
        let mad = [0x5au8; 256];
        a.send(b.local_addr(), &mad).await.unwrap();
        let (_, got) = b.recv().await.unwrap();
        assert_eq!(&got[..], &mad[..]);
        let p = rx.try_recv().unwrap();
        assert_eq!(p.from, a.socket_addr());
        assert_eq!(p.bth.opcode, Opcode::XRC_SEND_ONLY);
        assert_eq!(p.bth.dest_qp.get(), 0x4a);
        assert_eq!(p.bth.psn.get(), 7);
        // XRCETH (SRQ 0x10), then the payload without its pad
        assert_eq!(&p.body[..], b"\x00\x00\x00\x10hello");
        let st = b.stats();
        assert_eq!(st.data.load(Ordering::Relaxed), 1);
        assert_eq!(st.data_dropped.load(Ordering::Relaxed), 1);
        assert_eq!(st.icrc_bad.load(Ordering::Relaxed), 1);
        assert_eq!(st.not_mad.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn without_a_sink_data_packets_are_not_mads() {
        let (a, mut b) = pair("127.0.0.1").await;
        let to = b.socket_addr();
        a.send_datagram(to, &xrc_send(&a, &b, 1, b"z"))
            .await
            .unwrap();
        let mut a = a;
        a.send(b.local_addr(), &[1u8; 256]).await.unwrap();
        b.recv().await.unwrap();
        assert_eq!(b.stats().not_mad.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn ipv6_datagrams_with_udp_checksum_zero_arrive() {
        // rxe's RoCEv2 over IPv6 carries UDP checksum 0; the ICRC still checks it.
        let (mut a, mut b) = pair("[::1]").await;
        sys::set_udp_no_check6_tx(&a.sock).unwrap();
        let mad = [0xa5u8; 256];
        a.send(b.local_addr(), &mad).await.unwrap();
        // (a guard against a hang, not a timing assertion: the datagram is on loopback)
        let (from, got) = tokio::time::timeout(std::time::Duration::from_secs(10), b.recv())
            .await
            .expect("the checksum-0 datagram never arrived")
            .unwrap();
        assert_eq!(from, a.local_addr());
        assert_eq!(&got[..], &mad[..]);
        assert_eq!(b.stats().icrc_bad.load(Ordering::Relaxed), 0);
        // Without UDP_NO_CHECK6_RX the kernel drops such a datagram before the socket: a
        // plain IPv6 socket gets only the datagram sent with a checksum after it.
        let plain = std::net::UdpSocket::bind("[::1]:0").unwrap();
        a.send(PeerAddr::Udp(plain.local_addr().unwrap()), &mad)
            .await
            .unwrap();
        let checked = std::net::UdpSocket::bind("[::1]:0").unwrap();
        checked
            .send_to(b"with checksum", plain.local_addr().unwrap())
            .unwrap();
        let mut buf = [0u8; 512];
        let (n, _) = plain.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"with checksum");
    }

    #[tokio::test]
    async fn batches_keep_order_and_report_failures_by_index() {
        let (mut a, mut b) = pair("127.0.0.1").await;
        // 150 MADs: three sendmmsg batches. Three cannot go: an IB address (not for this
        // transport), the broadcast address (no SO_BROADCAST: sendmmsg stops there, in the
        // middle of a batch) and an IPv6 destination from an IPv4 socket.
        let v6: SocketAddr = "[::1]:4791".parse().unwrap();
        let bcast: SocketAddr = "255.255.255.255:4791".parse().unwrap();
        let ib = PeerAddr::Ib(crate::proto::IbAddr::roce(ibcm_mad::Gid::from_ip(
            "10.0.0.1".parse().unwrap(),
        )));
        let mads: Vec<Transmit> = (0..150u8)
            .map(|i| Transmit {
                to: match i {
                    7 => ib,
                    70 => PeerAddr::Udp(bcast),
                    100 => PeerAddr::Udp(v6),
                    _ => b.local_addr(),
                },
                mad: Bytes::from(vec![i; MAD_LEN]),
            })
            .collect();
        let failed = a.send_batch(&mads).await;
        let idx: Vec<usize> = failed.iter().map(|(i, _)| *i).collect();
        assert_eq!(idx, [7, 70, 100]);
        assert_eq!(a.stats().tx.load(Ordering::Relaxed), 147);
        let mut got = Vec::new();
        while got.len() < 147 {
            b.recv_batch(&mut got).await.unwrap();
            b.try_recv_batch(&mut got).unwrap();
        }
        assert_eq!(got.len(), 147);
        let firsts: Vec<u8> = got.iter().map(|(_, m)| m[0]).collect();
        let want: Vec<u8> = (0..150u8).filter(|i| ![7, 70, 100].contains(i)).collect();
        assert_eq!(firsts, want);
        assert!(got
            .iter()
            .all(|(from, m)| *from == a.local_addr() && m.len() == MAD_LEN));
        // Every byte is its own MAD's (the MADs of a batch share one buffer, and these are
        // all still held while later batches are received).
        assert!(got
            .iter()
            .zip(&want)
            .all(|((_, m), &w)| m.iter().all(|&x| x == w)));
        // Nothing left: a non-blocking receive adds nothing.
        b.try_recv_batch(&mut got).unwrap();
        assert_eq!(got.len(), 147);
    }

    #[tokio::test]
    async fn a_short_batch_clears_readiness_and_the_next_datagram_still_wakes() {
        let (mut a, mut b) = pair("127.0.0.1").await;
        let dst = b.local_addr();
        let to = |n: u8| -> Vec<Transmit> {
            (0..n)
                .map(|i| Transmit {
                    to: dst,
                    mad: Bytes::from(vec![i; MAD_LEN]),
                })
                .collect()
        };
        // A full batch keeps the socket readable; the short one after it empties it.
        assert!(a.send_batch(&to(70)).await.is_empty());
        let mut got = Vec::new();
        while got.len() < 70 {
            b.recv_batch(&mut got).await.unwrap();
        }
        assert_eq!(got.len(), 70);
        assert_eq!(b.stats().recv_calls.load(Ordering::Relaxed), 2);
        // Nothing there: no datagram, and no call that moved any.
        b.try_recv_batch(&mut got).unwrap();
        assert_eq!(got.len(), 70);
        assert_eq!(b.stats().recv_calls.load(Ordering::Relaxed), 2);
        // Datagrams sent after the readiness was cleared wake the next wait.
        assert!(a.send_batch(&to(3)).await.is_empty());
        let wait = tokio::time::timeout(std::time::Duration::from_secs(30), async {
            while got.len() < 73 {
                b.recv_batch(&mut got).await.unwrap();
            }
        });
        assert!(
            wait.await.is_ok(),
            "the datagrams sent later never woke the receiver"
        );
        let firsts: Vec<u8> = got.iter().skip(70).map(|(_, m)| m[0]).collect();
        assert_eq!(firsts, [0, 1, 2]);
        assert_eq!(b.stats().rx.load(Ordering::Relaxed), 73);
    }
}
