//! `cm-listen` and `cm-connect`: ibcm's sans-IO CM endpoint ([`Endpoint`]) on the simulated
//! port, LID-routed (issue 27: "LID-routed CM over umad on an IB port"), its path from the
//! SA ([`ibcm::sa::req_path`] of OpenSM's PathRecord, as `cm_format_req` fills the REQ).
//!
//! What stock ibsim asks of a CM: it forwards QP1 Sends (every CM MAD) only to a client that
//! holds the port's SM flag, so this process opens `/dev/infiniband/issm0` after registering
//! its agents; OpenSM then sees an SM-capable port and asks it for SMInfo, which this
//! process answers (GetResp, state NOTACTIVE, priority 0) so that OpenSM goes on as the
//! master; any other SMP to it is answered with status 0x000C (unsupported method/attribute)
//! rather than left to time out. A MAD of an unregistered class would crash the process in
//! umad2sim, so classes 0x01 and 0x81 are registered.
//!
//! ```text
//! ib-fabric-probe cm-listen [--service S] [--count N]
//! ib-fabric-probe cm-connect --dlid N [--service S] [--count N] [--qpn Q] [--cm-timeout T]
//! ```
//! `cm-listen` accepts every REQ for the service (QPN 0x100 + its number) until it has seen
//! `--count` connections established and closed by the peer, then prints `listen established
//! E closed C` and exits 0. `cm-connect` resolves the path to `--dlid` (PathRecord Get), then
//! `--count` times in a row connects (REQ with that path, auto RTU), waits for ESTABLISHED,
//! disconnects (DREQ) and waits for the connection to close (`--cm-timeout T`: the REQ's
//! remote CM response timeout exponent, 15 retries, for a lossy link); it prints `connect established
//! E of N closed C resent R path slid S dlid D mtu M` and exits 0 when all N went through.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ibcm::proto::{
    AcceptParams, ConnectParams, Endpoint, EndpointConfig, EventKind, IbAddr, ListenOptions,
    PeerAddr,
};
use ibcm::rt::umad::{UmadHdr, UMAD_HDR_LEN};
use ibcm::sa::{req_path, PathQuery};
use ibcm_mad::sa::PathRecord;
use ibcm_mad::{Guid, Lid, Qkey, Qpn, ServiceId, TimeoutExp, U4};

use super::{client_for, drive, sys, Args, Dev, Port, HDR};

/// SMInfo's attribute ID.
const ATTR_SM_INFO: u16 = 0x0020;
/// GetResp.
const METHOD_GET_RESP: u8 = 0x81;
/// Get.
const METHOD_GET: u8 = 0x01;
/// MAD status: unsupported method/attribute combination.
const STATUS_UNSUPPORTED_ATTR: u16 = 0x000C;
/// The default service ID.
const SERVICE: u64 = 0x1000_0000_00ca_fe27;

/// The device with the CM's agents, the SM flag and the SMP answers. Shared (`&self`): the
/// async transport reads it in a thread of its own and writes from the driver's task.
pub(crate) struct CmDev {
    umad: sys::Umad,
    cm_agent: u32,
    _issm: sys::Umad,
    buf: Mutex<Vec<u8>>,
    /// The port GUID (GID 0's interface ID), SMInfo's GUID.
    port_guid: [u8; 8],
    /// SMPs answered (SMInfo, others).
    sm_info: AtomicU64,
    smp_other: AtomicU64,
    /// Records whose send failed at the simulator (status != 0).
    send_failed: AtomicU64,
}

impl CmDev {
    pub(crate) fn open(umad: sys::Umad, port: &Port) -> Result<Self, String> {
        let reg = |class: u8, version: u8, qpn: u8| {
            let mut req = sys::UmadRegReq {
                qpn,
                mgmt_class: class,
                mgmt_class_version: version,
                ..Default::default()
            };
            umad.register(&mut req)
                .map_err(|e| format!("register class {class:#04x}: {e}"))
        };
        let cm_agent = reg(0x07, 2, 1)?;
        reg(0x01, 1, 0)?;
        reg(0x81, 1, 0)?;
        // after the agents: ibsim now forwards QP1 Sends to this process
        let issm = sys::Umad::open("/dev/infiniband/issm0")
            .map_err(|e| format!("open issm0 (the SM flag): {e}"))?;
        Ok(CmDev {
            umad,
            cm_agent,
            _issm: issm,
            buf: Mutex::new(vec![0; HDR + 4096]),
            port_guid: port.gid.0[8..].try_into().unwrap_or_default(),
            sm_info: AtomicU64::new(0),
            smp_other: AtomicU64::new(0),
            send_failed: AtomicU64::new(0),
        })
    }

    pub(crate) fn send_cm(&self, to: &IbAddr, mad: &[u8]) -> Result<(), String> {
        let h = UmadHdr {
            id: self.cm_agent,
            qpn: to.qpn,
            qkey: to.qkey,
            lid: to.lid,
            sl: to.sl,
            ..UmadHdr::default()
        };
        let mut rec = h.encode()[..HDR].to_vec();
        rec.extend_from_slice(mad);
        self.umad.write(&rec).map_err(|e| format!("write: {e}"))?;
        Ok(())
    }

    /// Answers an SMP (class 0x01 or 0x81) on QP0, to whoever sent it.
    fn answer_smp(&self, hdr: &UmadHdr, mad: &[u8]) -> Result<(), String> {
        let (Some(&class), Some(&method)) = (mad.get(1), mad.get(3)) else {
            return Ok(());
        };
        if method != METHOD_GET && method != 0x02 {
            return Ok(()); // a response or a trap: nothing to answer
        }
        let attr = mad
            .get(16..18)
            .map_or(0, |b| u16::from_be_bytes([b[0], b[1]]));
        let mut r = mad.to_vec();
        r[3] = METHOD_GET_RESP;
        let status = if attr == ATTR_SM_INFO && method == METHOD_GET {
            self.sm_info.fetch_add(1, Ordering::Relaxed);
            // SMInfo (64 bytes at 64): GUID, SM_Key, ActCount, Priority/SMState. NOTACTIVE
            // with priority 0: OpenSM stays the master.
            if let Some(d) = r.get_mut(64..128) {
                d.fill(0);
                d[..8].copy_from_slice(&self.port_guid);
            }
            0
        } else {
            self.smp_other.fetch_add(1, Ordering::Relaxed);
            STATUS_UNSUPPORTED_ATTR
        };
        if class == 0x81 {
            // directed route: the D bit (bit 15 of the status word) marks a response
            let s = 0x8000 | status;
            r[4..6].copy_from_slice(&s.to_be_bytes());
        } else {
            r[4..6].copy_from_slice(&status.to_be_bytes());
        }
        let h = UmadHdr {
            id: hdr.id,
            qpn: Qpn::masked(0),
            qkey: Qkey(0),
            lid: hdr.lid,
            sl: hdr.sl,
            ..UmadHdr::default()
        };
        let mut rec = h.encode()[..HDR].to_vec();
        rec.extend_from_slice(&r);
        self.umad
            .write(&rec)
            .map_err(|e| format!("write SMP answer: {e}"))?;
        Ok(())
    }

    /// The next CM MAD (source, bytes), answering SMPs on the way; `None` after `wait`.
    pub(crate) fn recv_cm(&self, wait: Duration) -> Result<Option<(IbAddr, Vec<u8>)>, String> {
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ms = i32::try_from(left.as_millis()).unwrap_or(i32::MAX);
            let (hdr, mad) = {
                let mut buf = self.buf.lock().unwrap_or_else(|e| e.into_inner());
                let Some(n) = self
                    .umad
                    .read_timeout(&mut buf, ms)
                    .map_err(|e| format!("read: {e}"))?
                else {
                    if left.is_zero() {
                        return Ok(None);
                    }
                    continue;
                };
                if n <= HDR {
                    continue;
                }
                let mut h = [0u8; UMAD_HDR_LEN];
                h[..HDR].copy_from_slice(&buf[..HDR]);
                (UmadHdr::decode(&h), buf[HDR..n].to_vec())
            };
            if hdr.status != 0 {
                // a send of ours the simulator could not deliver (status 110: dropped)
                self.send_failed.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            match mad.get(1) {
                Some(0x07) => return Ok(Some((hdr.peer(), mad))),
                Some(0x01 | 0x81) => self.answer_smp(&hdr, &mad)?,
                _ => {}
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
        }
    }
}

/// Runs the endpoint: sends what it has, waits for a MAD or its next timer.
fn turn(ep: &mut Endpoint, dev: &CmDev) -> Result<(), String> {
    while let Some(t) = ep.poll_transmit() {
        let PeerAddr::Ib(to) = t.to else {
            return Err(format!("a MAD for a non-IB peer {:?}", t.to));
        };
        dev.send_cm(&to, &t.mad)?;
    }
    let now = Instant::now();
    let wait = ep
        .poll_timeout()
        .map_or(Duration::from_millis(200), |t| {
            t.saturating_duration_since(now)
        })
        .min(Duration::from_millis(200));
    match dev.recv_cm(wait)? {
        Some((from, mad)) => ep.handle_datagram(Instant::now(), PeerAddr::Ib(from), &mad),
        None => ep.handle_timeout(Instant::now()),
    }
    Ok(())
}

/// The endpoint's configuration on this port (both the sans-IO and the async cells).
pub(crate) fn config(port: &Port) -> EndpointConfig {
    EndpointConfig {
        local_ca_guid: Guid(0x0002_c903_0000_0000 | u64::from(port.lid)),
        local_gid: port.gid,
        ..EndpointConfig::default()
    }
}

/// QP1 of the port with LID `lid`, addressed by LID alone (no GRH).
pub(crate) fn qp1(lid: Lid, sl: u8) -> IbAddr {
    IbAddr {
        lid,
        gid: None,
        qpn: Qpn::masked(1),
        qkey: Qkey::GSI,
        sl,
        pkey_index: 0,
    }
}

/// What the listen modes are asked for: the service and how many connections.
pub(crate) fn service_and_count(args: &Args) -> Result<(ServiceId, u64), String> {
    Ok((
        ServiceId(args.num("--service")?.unwrap_or(SERVICE)),
        args.num("--count")?.unwrap_or(1),
    ))
}

/// What the connect modes connect to: `--count` connections to `--service` at `--dlid`, from
/// QPN `--qpn` on, over the path the SA gives (asked through its agent on the same device).
pub(crate) struct Target {
    pub(crate) service: ServiceId,
    pub(crate) count: u64,
    qpn: u32,
    pub(crate) path: PathRecord,
}

impl Target {
    pub(crate) fn resolve(args: &Args, port: &Port, sa: &mut Dev) -> Result<Self, String> {
        let (service, count) = service_and_count(args)?;
        let dlid = Lid(args.num("--dlid")?.ok_or("the connect modes need --dlid")? as u16);
        let qpn = args.num("--qpn")?.unwrap_or(0x200) as u32;
        let mut client = client_for(args, port)?;
        let q = PathQuery::by_lids(Lid(port.lid), dlid);
        let id = client.query(&q, Instant::now());
        let recs = drive(&mut client, sa, id)?.map_err(|e| format!("path: {e}"))?;
        let path = *recs.first().ok_or("the SA returned no path")?;
        Ok(Target {
            service,
            count,
            qpn,
            path,
        })
    }

    /// The REQ of connection `i`: the peer's QP1 by LID, the primary path from the
    /// PathRecord as `cm_format_req` builds it.
    pub(crate) fn params(&self, i: u64) -> ConnectParams {
        let to = qp1(self.path.dlid, self.path.sl.get());
        let qpn = Qpn::masked(self.qpn.wrapping_add(i as u32));
        let mut p = ConnectParams::new(PeerAddr::Ib(to), self.service, qpn);
        p.primary_path = Some(req_path(&self.path, 15));
        p.path_mtu = self.path.mtu;
        p
    }
}

/// `cm-listen`.
pub(crate) fn listen(args: &Args, port: &Port, sa: Dev) -> Result<bool, String> {
    let (service, count) = service_and_count(args)?;
    let dev = CmDev::open(sa.umad, port)?;
    let mut ep = Endpoint::new(config(port));
    ep.listen(service, ListenOptions::default());
    println!("listening on {service} lid {}", port.lid);
    let (mut established, mut closed, mut next_qpn) = (0u64, 0u64, 0x100u32);
    let deadline = Instant::now() + Duration::from_secs(120);
    while closed < count {
        if Instant::now() > deadline {
            println!("listen established {established} closed {closed} (gave up after 120 s)");
            return Ok(false);
        }
        turn(&mut ep, &dev)?;
        while let Some(ev) = ep.poll_event() {
            match ev.kind {
                EventKind::ReqReceived(_) => {
                    let qpn = Qpn::masked(next_qpn);
                    next_qpn += 1;
                    let mut a = AcceptParams::new(qpn);
                    a.starting_psn = ep.random_psn();
                    ep.accept(Instant::now(), ev.conn, a)
                        .map_err(|e| format!("accept: {e}"))?;
                }
                EventKind::Established => established += 1,
                EventKind::Closed(_) => closed += 1,
                _ => {}
            }
        }
    }
    // the last DREP out
    turn(&mut ep, &dev)?;
    println!(
        "listen established {established} closed {closed} sminfo_answered {} smp_other {}",
        dev.sm_info.load(Ordering::Relaxed),
        dev.smp_other.load(Ordering::Relaxed)
    );
    Ok(established == count)
}

/// `cm-connect`.
pub(crate) fn connect(args: &Args, port: &Port, mut sa: Dev) -> Result<bool, String> {
    let t = Target::resolve(args, port, &mut sa)?;
    let (count, path) = (t.count, t.path);
    let cm_timeout = args.num("--cm-timeout")?.map(|t| t as u8);
    let dev = CmDev::open(sa.umad, port)?;
    let mut ep = Endpoint::new(config(port));
    let (mut established, mut closed) = (0u64, 0u64);
    let start = Instant::now();
    for i in 0..count {
        let mut p = t.params(i);
        if let Some(t) = cm_timeout {
            // a lossy link: each REQ try waits 4.096 us * 2^t, 15 retries
            p.remote_cm_response_timeout = TimeoutExp::masked(t);
            p.max_cm_retries = U4::masked(15);
        }
        let conn = ep
            .connect(Instant::now(), p)
            .map_err(|e| format!("connect {i}: {e}"))?;
        let t0 = Instant::now();
        let mut up = false;
        loop {
            if t0.elapsed() > Duration::from_secs(30) {
                return Err(format!("connection {i}: nothing after 30 s"));
            }
            turn(&mut ep, &dev)?;
            let mut done = false;
            while let Some(ev) = ep.poll_event() {
                if ev.conn != conn {
                    continue;
                }
                match ev.kind {
                    EventKind::Established => {
                        established += 1;
                        up = true;
                        ep.disconnect(Instant::now(), conn, &[])
                            .map_err(|e| format!("disconnect {i}: {e}"))?;
                    }
                    EventKind::Closed(e) => {
                        if up {
                            closed += 1;
                        } else {
                            println!("connection {i} failed: {e}");
                        }
                        done = true;
                    }
                    _ => {}
                }
            }
            if done {
                break;
            }
        }
        if !up {
            break;
        }
    }
    let s = ep.stats();
    println!(
        "connect established {established} of {count} closed {closed} resent {} sends_lost {} \
         path slid {} dlid {} sl {} mtu {} in {} ms",
        s.retransmits,
        dev.send_failed.load(Ordering::Relaxed),
        path.slid.0,
        path.dlid.0,
        path.sl.get(),
        path.mtu.raw(),
        start.elapsed().as_millis()
    );
    Ok(established == count && closed == count)
}
