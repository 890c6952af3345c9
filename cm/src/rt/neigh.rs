//! Whether the kernel can address a RoCE destination without waiting, for the umad transport.
//!
//! On RoCE every umad `write` creates an address handle, and the kernel resolves the
//! destination's MAC address for it *synchronously*: `rdma_addr_find_l2_eth_by_grh`
//! (`drivers/infiniband/core/addr.c`) starts ARP / neighbour discovery and waits for it, up to
//! 1 s, inside the writer's system call. A write to an address whose neighbour entry is not
//! valid therefore stops the whole driver for up to a second; a REQ flood from a few spoofed
//! sources held ibcm's listener in the lab silent for seconds (every answer waited), and one
//! from random sources would stop it for good. (The kernel CM resolves the same way, but in its
//! work queue, not in the path that reads MADs.)
//!
//! So the transport asks the kernel's routing and neighbour tables first (rtnetlink requests
//! answered at once: `RTM_GETROUTE`, `RTM_GETNEIGH`) and writes at once only when the next
//! hop's neighbour entry is valid (`NUD_VALID`: the state in which the kernel's resolution
//! answers without waiting). Otherwise it asks the kernel to resolve it (`RTM_NEWNEIGH` with
//! `NTF_USE`, as `ip neigh replace … use`) and holds the MAD until it is ([`Reach::Later`]).
//! Where these requests are not available (no `CAP_NET_ADMIN`, a kernel before 4.20) the
//! transport writes at once as before, after one warning.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};
use tracing::{trace, warn};

/// What [`Neighbours::reach`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reach {
    /// A write now does not wait for address resolution (or the check is not possible).
    Now,
    /// The next hop is being resolved: hold the MAD and ask again.
    Later,
}

/// How long a valid neighbour is taken as valid without asking again.
const VALID_FOR: Duration = Duration::from_secs(1);

/// Destinations remembered as valid at most (the table is cleared when full).
const KNOWN_MAX: usize = 4096;

/// The neighbour states in which the kernel resolves without waiting (`NUD_VALID` of
/// `include/net/neighbour.h`: PERMANENT, NOARP, REACHABLE, PROBE, STALE, DELAY).
const NUD_VALID: u16 = 0x80 | 0x40 | 0x02 | 0x10 | 0x04 | 0x08;

// rtnetlink (include/uapi/linux/netlink.h, rtnetlink.h, neighbour.h).
const NLMSG_ERROR: u16 = 2;
const RTM_NEWROUTE: u16 = 24;
const RTM_GETROUTE: u16 = 26;
const RTM_NEWNEIGH: u16 = 28;
const RTM_GETNEIGH: u16 = 30;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_REPLACE: u16 = 0x100;
const NLM_F_CREATE: u16 = 0x400;
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const NDA_DST: u16 = 1;
const NTF_USE: u8 = 0x01;
const NUD_PERMANENT: u16 = 0x80;
const RTN_UNICAST: u8 = 1;
const NLMSG_HDR: usize = 16;
const RTMSG_LEN: usize = 12;
const NDMSG_LEN: usize = 12;

/// The next hop the kernel routes `dst` through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Hop {
    oif: u32,
    addr: IpAddr,
}

/// The kernel's answer to one request.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    /// `RTM_NEWROUTE`: route type, output interface, gateway.
    Route {
        kind: u8,
        oif: Option<u32>,
        gateway: Option<IpAddr>,
    },
    /// `RTM_NEWNEIGH`: the entry's state.
    Neigh { state: u16 },
    /// `NLMSG_ERROR` (0: an acknowledgement).
    Error(i32),
}

/// The rtnetlink socket and what it told.
pub(crate) struct Neighbours {
    /// `None`: checks are off (could not be opened, or a request was refused).
    sock: Option<Socket>,
    seq: u32,
    /// Destinations whose next hop was valid, until when.
    known: HashMap<IpAddr, Instant>,
    /// Tests: the answers to give instead of asking the kernel (then `Later` for ever).
    #[cfg(test)]
    script: Option<std::collections::VecDeque<Reach>>,
}

impl std::fmt::Debug for Neighbours {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Neighbours")
            .field("checking", &self.sock.is_some())
            .field("known", &self.known.len())
            .finish()
    }
}

impl Neighbours {
    /// Opens the rtnetlink socket; without it every destination is [`Reach::Now`].
    pub(crate) fn open() -> Self {
        let sock = Socket::new(
            Domain::from(libc::AF_NETLINK),
            Type::DGRAM.cloexec(),
            Some(Protocol::from(libc::NETLINK_ROUTE)),
        )
        .and_then(|s| {
            s.set_read_timeout(Some(Duration::from_millis(200)))?;
            Ok(s)
        });
        let sock = match sock {
            Ok(s) => Some(s),
            Err(e) => {
                warn!(error = %e, "umad: no rtnetlink socket; writes to unresolved RoCE \
                       destinations will wait for ARP in the kernel");
                None
            }
        };
        Neighbours {
            sock,
            seq: 0,
            known: HashMap::new(),
            #[cfg(test)]
            script: None,
        }
    }

    /// Tests: a table that answers `answers` in turn, then [`Reach::Later`].
    #[cfg(test)]
    pub(crate) fn scripted(answers: &[Reach]) -> Self {
        Neighbours {
            script: Some(answers.iter().copied().collect()),
            ..Neighbours::open()
        }
    }

    /// Whether a write to `dst` goes out without waiting for address resolution; when not
    /// and `resolve` is set, the kernel has been asked to resolve it (an ARP request or
    /// neighbour solicitation: the caller asks only for destinations it can hold MADs for, so
    /// that a flood from spoofed sources does not become one ARP request per REQ).
    pub(crate) fn reach(&mut self, dst: IpAddr, now: Instant, resolve: bool) -> Reach {
        if self.known.get(&dst).is_some_and(|&until| now < until) {
            return Reach::Now;
        }
        if self.sock.is_none() {
            return Reach::Now;
        }
        let r = self.check(dst, resolve);
        trace!(%dst, result = ?r, "neighbour check");
        match r {
            Ok(Reach::Now) => {
                if self.known.len() >= KNOWN_MAX {
                    self.known.clear();
                }
                self.known.insert(dst, now + VALID_FOR);
                Reach::Now
            }
            Ok(Reach::Later) => Reach::Later,
            Err(e) => {
                warn!(error = %e, %dst, "umad: the kernel's neighbour table cannot be asked; \
                       writes to unresolved RoCE destinations will wait for ARP in the kernel");
                self.sock = None;
                Reach::Now
            }
        }
    }

    fn check(&mut self, dst: IpAddr, resolve: bool) -> io::Result<Reach> {
        #[cfg(test)]
        if let Some(script) = self.script.as_mut() {
            return Ok(script.pop_front().unwrap_or(Reach::Later));
        }
        let route = self.request(&route_request(dst))?;
        trace!(%dst, ?route, "route");
        let hop = match route {
            Answer::Route {
                kind: RTN_UNICAST,
                oif: Some(oif),
                gateway,
            } => Hop {
                oif,
                addr: gateway.unwrap_or(dst),
            },
            // Local, unreachable, no route: the kernel answers without ARP (or fails at once).
            _ => return Ok(Reach::Now),
        };
        let neigh = self.request(&neigh_request(hop, false))?;
        trace!(%dst, ?neigh, "neighbour");
        match neigh {
            Answer::Neigh { state } if state & NUD_VALID != 0 => return Ok(Reach::Now),
            Answer::Neigh { .. } => {}
            Answer::Error(e) if e == -libc::ENOENT => {}
            Answer::Error(e) => return Err(io::Error::from_raw_os_error(-e)),
            Answer::Route { .. } => return Err(io::Error::other("a route for a neighbour")),
        }
        if !resolve {
            return Ok(Reach::Later);
        }
        match self.request(&neigh_request(hop, true))? {
            Answer::Error(0) => Ok(Reach::Later),
            Answer::Error(e) => Err(io::Error::from_raw_os_error(-e)),
            _ => Err(io::Error::other("no acknowledgement")),
        }
    }

    /// Sends one request (its sequence number set here) and returns the kernel's answer.
    fn request(&mut self, msg: &[u8]) -> io::Result<Answer> {
        let sock = self
            .sock
            .as_ref()
            .ok_or_else(|| io::Error::other("closed"))?;
        self.seq = self.seq.wrapping_add(1);
        let mut msg = msg.to_vec();
        if let Some(s) = msg.get_mut(8..12) {
            s.copy_from_slice(&self.seq.to_ne_bytes());
        }
        (&*sock).write_all(&msg)?;
        let mut buf = [0u8; 1024];
        loop {
            let n = (&*sock).read(&mut buf)?;
            let reply = buf.get(..n).unwrap_or(&[]);
            match parse(reply) {
                Some((seq, a)) if seq == self.seq => return Ok(a),
                // A late answer to an earlier request, or something else: skip it.
                Some(_) => {}
                None => return Err(io::Error::other("malformed rtnetlink answer")),
            }
        }
    }
}

/// The IP address a RoCE GID stands for; `None` for a link-local GID (RoCE v1 and native IB
/// do not go through the IP stack).
pub(crate) fn roce_ip(gid: ibcm_mad::Gid) -> Option<IpAddr> {
    match gid.to_ip() {
        IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80 => None,
        ip => Some(ip),
    }
}

fn family(ip: IpAddr) -> (u8, Vec<u8>) {
    match ip {
        IpAddr::V4(v4) => (libc::AF_INET as u8, v4.octets().to_vec()),
        IpAddr::V6(v6) => (libc::AF_INET6 as u8, v6.octets().to_vec()),
    }
}

/// A netlink message: header (sequence number 0, set when sent), body, attributes.
fn message(kind: u16, flags: u16, body: &[u8], attrs: &[(u16, &[u8])]) -> Vec<u8> {
    let len: usize = NLMSG_HDR
        + body.len()
        + attrs
            .iter()
            .map(|(_, d)| (4 + d.len()).next_multiple_of(4))
            .sum::<usize>();
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&(len as u32).to_ne_bytes());
    m.extend_from_slice(&kind.to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&[0; 8]); // sequence number, port ID
    m.extend_from_slice(body);
    for (t, data) in attrs {
        let len = 4 + data.len();
        m.extend_from_slice(&(len as u16).to_ne_bytes());
        m.extend_from_slice(&t.to_ne_bytes());
        m.extend_from_slice(data);
        m.resize(m.len().next_multiple_of(4), 0);
    }
    m
}

/// `RTM_GETROUTE` for `dst` (one route, as `ip route get`).
fn route_request(dst: IpAddr) -> Vec<u8> {
    let (fam, addr) = family(dst);
    let mut body = [0u8; RTMSG_LEN];
    body[0] = fam;
    body[1] = (addr.len() * 8) as u8;
    message(RTM_GETROUTE, NLM_F_REQUEST, &body, &[(RTA_DST, &addr)])
}

/// `RTM_GETNEIGH` for the hop's entry, or (`resolve`) `RTM_NEWNEIGH` with `NTF_USE`: create
/// the entry if needed and start resolving it, acknowledged.
fn neigh_request(hop: Hop, resolve: bool) -> Vec<u8> {
    let (fam, addr) = family(hop.addr);
    let mut body = [0u8; NDMSG_LEN];
    body[0] = fam;
    body[4..8].copy_from_slice(&hop.oif.to_ne_bytes());
    if resolve {
        // The state is not applied with NTF_USE; iproute2 sends PERMANENT, so do we.
        body[8..10].copy_from_slice(&NUD_PERMANENT.to_ne_bytes());
        body[10] = NTF_USE;
        let flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE;
        message(RTM_NEWNEIGH, flags, &body, &[(NDA_DST, &addr)])
    } else {
        message(RTM_GETNEIGH, NLM_F_REQUEST, &body, &[(NDA_DST, &addr)])
    }
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(*b.get(at..)?.first_chunk()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(*b.get(at..)?.first_chunk()?))
}

fn ip_of(data: &[u8]) -> Option<IpAddr> {
    match data.len() {
        4 => Some(IpAddr::from(*data.first_chunk::<4>()?)),
        16 => Some(IpAddr::from(*data.first_chunk::<16>()?)),
        _ => None,
    }
}

/// The first message of a netlink answer: its sequence number and what it says.
fn parse(b: &[u8]) -> Option<(u32, Answer)> {
    let len = u32_at(b, 0)? as usize;
    let b = b.get(..len)?;
    let kind = u16_at(b, 4)?;
    let seq = u32_at(b, 8)?;
    let a = match kind {
        NLMSG_ERROR => Answer::Error(u32_at(b, NLMSG_HDR)? as i32),
        RTM_NEWNEIGH => Answer::Neigh {
            state: u16_at(b, NLMSG_HDR + 8)?,
        },
        RTM_NEWROUTE => {
            let kind = *b.get(NLMSG_HDR + 7)?;
            let (mut oif, mut gateway) = (None, None);
            let mut at = NLMSG_HDR + RTMSG_LEN;
            while at + 4 <= b.len() {
                let alen = u16_at(b, at)? as usize;
                let t = u16_at(b, at + 2)?;
                let data = b.get(at + 4..at + alen.max(4))?;
                match t {
                    RTA_OIF => oif = u32_at(data, 0),
                    RTA_GATEWAY => gateway = ip_of(data),
                    _ => {}
                }
                at += alen.max(4).next_multiple_of(4);
            }
            Answer::Route { kind, oif, gateway }
        }
        _ => return None,
    };
    Some((seq, a))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_laid_out_as_rtnetlink_wants() {
        let r = route_request("10.78.0.101".parse().unwrap());
        assert_eq!(r.len(), 16 + 12 + 8);
        assert_eq!(u32_at(&r, 0), Some(36));
        assert_eq!(u16_at(&r, 4), Some(RTM_GETROUTE));
        assert_eq!(r[16], libc::AF_INET as u8);
        assert_eq!(r[17], 32, "dst_len");
        assert_eq!(&r[28..36], &[8, 0, 1, 0, 10, 78, 0, 101]);
        let hop = Hop {
            oif: 6,
            addr: "fd00:78::2".parse().unwrap(),
        };
        let g = neigh_request(hop, false);
        assert_eq!(g.len(), 16 + 12 + 20);
        assert_eq!(u16_at(&g, 4), Some(RTM_GETNEIGH));
        assert_eq!(g[16], libc::AF_INET6 as u8);
        assert_eq!(u32_at(&g, 20), Some(6));
        let u = neigh_request(hop, true);
        assert_eq!(u16_at(&u, 4), Some(RTM_NEWNEIGH));
        assert_eq!(u16_at(&u, 6), Some(0x505));
        assert_eq!(u[26], NTF_USE);
    }

    #[test]
    fn answers_parse_and_garbage_does_not_panic() {
        // RTM_NEWROUTE: unicast via 10.0.0.1 on interface 3.
        let mut body = [0u8; RTMSG_LEN];
        body[7] = RTN_UNICAST;
        let mut m = message(
            RTM_NEWROUTE,
            0,
            &body,
            &[
                (RTA_OIF, &3u32.to_ne_bytes()),
                (RTA_GATEWAY, &[10, 0, 0, 1]),
            ],
        );
        m[8..12].copy_from_slice(&7u32.to_ne_bytes());
        assert_eq!(
            parse(&m),
            Some((
                7,
                Answer::Route {
                    kind: RTN_UNICAST,
                    oif: Some(3),
                    gateway: Some("10.0.0.1".parse().unwrap())
                }
            ))
        );
        let e = message(NLMSG_ERROR, 0, &(-libc::ENOENT).to_ne_bytes(), &[]);
        assert_eq!(parse(&e), Some((0, Answer::Error(-libc::ENOENT))));
        for cut in 0..m.len() {
            let _ = parse(&m[..cut]);
        }
        let mut bad = m.clone();
        bad[28..30].copy_from_slice(&0u16.to_ne_bytes()); // a zero-length attribute
        let _ = parse(&bad);
        bad[28..30].copy_from_slice(&0xffffu16.to_ne_bytes());
        assert_eq!(parse(&bad), None);
    }

    #[test]
    fn link_local_gids_are_not_resolved_through_ip() {
        let ll = ibcm_mad::Gid::from_ip("fe80::1".parse().unwrap());
        assert_eq!(roce_ip(ll), None);
        let v4 = ibcm_mad::Gid::from_ip("10.1.2.3".parse().unwrap());
        assert_eq!(roce_ip(v4), Some("10.1.2.3".parse().unwrap()));
    }

    /// Against this machine's kernel: the loopback address needs no resolution.
    #[test]
    fn a_local_address_is_reachable_now() {
        let mut n = Neighbours::open();
        assert_eq!(
            n.reach("127.0.0.1".parse().unwrap(), super::super::now(), true),
            Reach::Now
        );
    }
}
