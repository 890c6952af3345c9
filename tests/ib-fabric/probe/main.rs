//! `ib-fabric-probe`: ibcm's SA client ([`ibcm::sa::SaClient`]) on a umad device, for the
//! native-IB lab (`tests/ib-fabric/run`: OpenSM on the ibsim fabric simulator, the process
//! under ibsim's umad2sim preload).
//!
//! ```text
//! ib-fabric-probe info
//! ib-fabric-probe path (--slid N --dlid N | --sgid GID [--dgid GID] [--pkey P] [--sl S])
//!                      [--table] [--numb-path N] [--save FILE] [--timeout-ms T] [--retries R] [--sm-lid N]
//! ib-fabric-probe repeat (query options as for path) [--count N]
//! ib-fabric-probe cache --sgid GID --dgid GID [--pkey P] [--sl S]
//! ib-fabric-probe bench --slid N --dlid N [--count N]
//! ib-fabric-probe cm-listen [--service S] [--count N]
//! ib-fabric-probe cm-connect --dlid N [--service S] [--count N] [--qpn Q]
//! ib-fabric-probe cm-async-listen | cm-async-connect   (the same through the async API)
//! ```
//! `info` prints this port's LID, SM LID/SL and GID 0 as umad2sim's simulated sysfs gives
//! them. `path` prints each PathRecord of the answer in `saquery -p`'s field names, one
//! `name value` per line (`record N` before each), or `error <reason>`; `--save` writes the
//! first SA MAD received (256 bytes). `repeat` asks the same query `--count` times and prints
//! `answered A of N sent S resent R timeouts T`. `cache` resolves one path twice through the
//! client's cache and prints `sent 1 cache_hits 1 cache_misses 1 same true` when the second
//! came from the cache. `bench` times a raw PathRecord Get round trip on umad
//! against the client's `resolve` on a cache miss and on a hit. `cm-listen` and `cm-connect`
//! run ibcm's CM endpoint LID-routed on the simulated port (module `cm`); `cm-async-*` the
//! same through the tokio driver and the async API (module `cm_async`); `sm-watch` the
//! library's SA client with a port watch across an SM restart (module `sm`).
//!
//! The device is opened through libc's `open` (module `sys`); the umad header is the
//! 56-byte layout (umad2sim accepts `IB_USER_MAD_ENABLE_PKEY` but keeps that layout, and a
//! real `ib_umad` without that ioctl uses it too).

mod cm;
mod cm_async;
mod sm;
mod sys;

use std::net::Ipv6Addr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use ibcm::rt::umad::{UmadHdr, UMAD_HDR_LEN};
use ibcm::sa::{PathQuery, QueryId, Resolve, SaClient, SaConfig, SaError, SaEvent};
use ibcm_mad::sa::{PathRecord, SaMad};
use ibcm_mad::{Gid, Lid, Pkey, Qkey, Qpn, Tid, U4};

/// The umad header length without P_Key index (`struct ib_user_mad_hdr_old` + padding).
const HDR: usize = 56;

struct Port {
    lid: u16,
    sm_lid: u16,
    sm_sl: u8,
    gid: Gid,
}

/// Reads umad2sim's simulated sysfs (`./sys-<pid>/sys/class/infiniband/<dev>/ports/1`).
fn port_info() -> Result<Port, String> {
    let base = PathBuf::from(format!("sys-{}/sys/class/infiniband", std::process::id()));
    let dev = std::fs::read_dir(&base)
        .map_err(|e| format!("{}: {e}", base.display()))?
        .filter_map(Result::ok)
        .next()
        .ok_or_else(|| format!("{}: no device", base.display()))?
        .path()
        .join("ports/1");
    let rd = |f: &str| std::fs::read_to_string(dev.join(f)).unwrap_or_default();
    let num = |f: &str| {
        let s = rd(f);
        let s = s.trim();
        s.strip_prefix("0x")
            .map_or_else(|| s.parse().ok(), |h| u16::from_str_radix(h, 16).ok())
            .unwrap_or(0)
    };
    let gid_text = rd("gids/0").trim().replace(':', "");
    let mut gid = [0u8; 16];
    for (i, b) in gid.iter_mut().enumerate() {
        *b = gid_text
            .get(2 * i..2 * i + 2)
            .and_then(|h| u8::from_str_radix(h, 16).ok())
            .unwrap_or(0);
    }
    Ok(Port {
        lid: num("lid"),
        sm_lid: num("sm_lid"),
        sm_sl: num("sm_sl") as u8,
        gid: Gid(gid),
    })
}

struct Dev {
    umad: sys::Umad,
    agent: u32,
    buf: Vec<u8>,
    saved: Option<[u8; 256]>,
    saved_len: usize,
}

impl Dev {
    fn open() -> Result<Self, String> {
        let umad =
            sys::Umad::open("/dev/infiniband/umad0").map_err(|e| format!("open umad0: {e}"))?;
        let mut req = sys::UmadRegReq {
            qpn: 1,
            mgmt_class: 0x03,
            mgmt_class_version: 2,
            ..Default::default()
        };
        let agent = umad
            .register(&mut req)
            .map_err(|e| format!("register class 0x03: {e}"))?;
        Ok(Dev {
            umad,
            agent,
            buf: vec![0; HDR + 4096],
            saved: None,
            saved_len: 0,
        })
    }

    fn send(&self, lid: Lid, sl: u8, timeout_ms: u32, mad: &[u8]) -> Result<(), String> {
        let h = UmadHdr {
            id: self.agent,
            qpn: Qpn::masked(1),
            qkey: Qkey::GSI,
            lid,
            sl,
            timeout_ms,
            ..UmadHdr::default()
        };
        let mut rec = h.encode()[..HDR].to_vec();
        rec.extend_from_slice(mad);
        self.umad.write(&rec).map_err(|e| format!("write: {e}"))?;
        Ok(())
    }

    /// The next received SA MAD (its bytes after the header), or `None` after `wait`.
    fn recv(&mut self, wait: Duration) -> Result<Option<Vec<u8>>, String> {
        let ms = i32::try_from(wait.as_millis()).unwrap_or(i32::MAX);
        match self
            .umad
            .read_timeout(&mut self.buf, ms)
            .map_err(|e| format!("read: {e}"))?
        {
            Some(n) if n > HDR => {
                let mut h = [0u8; UMAD_HDR_LEN];
                h[..HDR].copy_from_slice(&self.buf[..HDR]);
                if UmadHdr::decode(&h).status != 0 {
                    return Ok(None);
                }
                let mad = self.buf[HDR..n].to_vec();
                if self.saved.is_none() {
                    let mut s = [0u8; 256];
                    let k = mad.len().min(256);
                    s[..k].copy_from_slice(&mad[..k]);
                    self.saved = Some(s);
                    self.saved_len = mad.len();
                }
                Ok(Some(mad))
            }
            _ => Ok(None),
        }
    }
}

/// Drives `client` until query `id` has its result.
fn drive(
    client: &mut SaClient,
    dev: &mut Dev,
    id: QueryId,
) -> Result<Result<Vec<PathRecord>, SaError>, String> {
    loop {
        while let Some(tx) = client.poll_transmit() {
            let t = client.config().timeout.as_millis() as u32;
            dev.send(tx.dest.lid, tx.dest.sl.get(), t, &tx.mad)?;
        }
        while let Some(ev) = client.poll_event() {
            let SaEvent::PathRecords { id: got, result } = ev;
            if got == id {
                return Ok(result);
            }
        }
        let now = Instant::now();
        let wait = client
            .poll_timeout()
            .map_or(Duration::from_secs(1), |t| t.saturating_duration_since(now));
        match dev.recv(wait)? {
            Some(mad) => client.handle_mad(&mad, Instant::now()),
            None => client.handle_timeout(Instant::now()),
        }
    }
}

/// One record in `saquery -p`'s field names and number formats.
fn print_record(p: &PathRecord) {
    let hop_flow_raw =
        (u32::from(p.raw_traffic) << 31) | (p.flow_label.get() << 8) | u32::from(p.hop_limit);
    let b = p.to_bytes();
    println!("service_id 0x{:016x}", p.service_id);
    println!("dgid {}", Ipv6Addr::from(p.dgid.0));
    println!("sgid {}", Ipv6Addr::from(p.sgid.0));
    println!("dlid {}", p.dlid.0);
    println!("slid {}", p.slid.0);
    println!("hop_flow_raw 0x{hop_flow_raw:x}");
    println!("tclass 0x{:x}", p.traffic_class);
    println!("num_path_revers 0x{:x}", b[49]);
    println!("pkey 0x{:04X}", p.pkey.0);
    println!("qos_class 0x{:x}", p.qos_class);
    println!("sl 0x{:x}", p.sl.get());
    println!("mtu 0x{:x}", b[54]);
    println!("rate 0x{:x}", b[55]);
    println!("pkt_life 0x{:x}", b[56]);
    println!("preference 0x{:x}", p.preference);
    println!("resv2 0x{:012x}", 0);
}

fn parse_gid(s: &str) -> Result<Gid, String> {
    s.parse::<Ipv6Addr>()
        .map(|a| Gid(a.octets()))
        .map_err(|e| format!("GID {s}: {e}"))
}

fn parse_num(s: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|e| format!("number {s}: {e}"))
}

struct Args(Vec<String>);

impl Args {
    fn val(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .position(|a| a == name)
            .and_then(|i| self.0.get(i + 1))
            .map(String::as_str)
    }
    fn num(&self, name: &str) -> Result<Option<u64>, String> {
        self.val(name).map(parse_num).transpose()
    }
    fn flag(&self, name: &str) -> bool {
        self.0.iter().any(|a| a == name)
    }
}

fn client_for(args: &Args, port: &Port) -> Result<SaClient, String> {
    let sm = args.num("--sm-lid")?.map_or(port.sm_lid, |v| v as u16);
    let mut cfg = SaConfig::new(1, Lid(sm));
    cfg.dest.sl = U4::masked(port.sm_sl);
    if let Some(t) = args.num("--timeout-ms")? {
        cfg.timeout = Duration::from_millis(t);
    }
    if let Some(r) = args.num("--retries")? {
        cfg.retries = r as u8;
    }
    Ok(SaClient::new(cfg, std::process::id()))
}

fn query_of(args: &Args) -> Result<PathQuery, String> {
    let mut q = match (
        args.val("--slid"),
        args.val("--dlid"),
        args.val("--sgid"),
        args.val("--dgid"),
    ) {
        (Some(s), Some(d), _, _) => {
            PathQuery::by_lids(Lid(parse_num(s)? as u16), Lid(parse_num(d)? as u16))
        }
        (_, _, Some(s), Some(d)) => {
            let pkey = Pkey(args.num("--pkey")?.unwrap_or(0xffff) as u16);
            PathQuery::by_gids(parse_gid(s)?, parse_gid(d)?, pkey)
        }
        (_, _, Some(s), None) => PathQuery {
            sgid: Some(parse_gid(s)?),
            ..PathQuery::default()
        },
        // Every path (a GetTable with no component: `saquery -p`).
        _ if args.flag("--table") => PathQuery::default(),
        _ => return Err("give --slid and --dlid, --sgid [and --dgid], or --table".into()),
    };
    if let Some(sl) = args.num("--sl")? {
        q.sl = Some(U4::masked(sl as u8));
    }
    q.table = args.flag("--table");
    if let Some(n) = args.num("--numb-path")? {
        q.numb_path = n as u8;
    }
    Ok(q)
}

/// Prints `v`'s figures; returns its median.
fn stats(name: &str, mut v: Vec<Duration>) -> Duration {
    v.sort();
    let n = v.len().max(1);
    let avg = v.iter().sum::<Duration>() / n as u32;
    let pct = |p: usize| {
        v.get((v.len() * p / 100).min(v.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    println!(
        "bench {name}: n={} avg={:.1}us p50={:.1}us p99={:.1}us max={:.1}us",
        v.len(),
        avg.as_secs_f64() * 1e6,
        pct(50).as_secs_f64() * 1e6,
        pct(99).as_secs_f64() * 1e6,
        v.last().copied().unwrap_or_default().as_secs_f64() * 1e6
    );
    pct(50)
}

fn bench(args: &Args, port: &Port, dev: &mut Dev) -> Result<(), String> {
    let count = args.num("--count")?.unwrap_or(200) as usize;
    let q = query_of(args)?;
    let mut client = client_for(args, port)?;
    let id = client.query(&q, Instant::now());
    let first = drive(&mut client, dev, id)?.map_err(|e| e.to_string())?;
    let p = *first.first().ok_or("no path")?;
    // A raw PathRecord Get round trip: the request written, its answer read, nothing else;
    // the very query `resolve` sends on a miss (by SGID/DGID/P_Key and SL), so that both ask
    // the SA the same. Raw, miss and hit are interleaved, one of each per round, so that a
    // change of the shared host's load falls on all three alike.
    let mut raw = Vec::with_capacity(count);
    let mut miss = Vec::with_capacity(count);
    let mut hit = Vec::with_capacity(count);
    let same = PathQuery {
        sl: Some(p.sl),
        ..PathQuery::by_gids(p.sgid, p.dgid, p.pkey)
    };
    let mad = same.to_mad(Tid(0));
    let sent_before = client.stats().sent;
    for i in 0..count {
        let mut m = mad.clone();
        let tid = 0x7000_0000 + i as u32;
        m.header.tid = Tid(u64::from(tid));
        let t0 = Instant::now();
        dev.send(
            Lid(client.config().dest.lid.0),
            port.sm_sl,
            1000,
            &m.to_bytes(),
        )?;
        loop {
            match dev.recv(Duration::from_secs(1))? {
                Some(a) => {
                    if SaMad::parse(&a).is_ok_and(|a| a.header.tid.0 as u32 == tid) {
                        break;
                    }
                }
                None => return Err(format!("raw Get {i}: no answer")),
            }
        }
        raw.push(t0.elapsed());
        client.cache_mut().clear();
        let t0 = Instant::now();
        match client.resolve(p.sgid, p.dgid, p.pkey, p.sl, t0) {
            Resolve::Pending(id) => {
                drive(&mut client, dev, id)?.map_err(|e| e.to_string())?;
            }
            Resolve::Cached(_) => return Err("cached after clear".into()),
        }
        miss.push(t0.elapsed());
        let t1 = Instant::now();
        match client.resolve(p.sgid, p.dgid, p.pkey, p.sl, t1) {
            Resolve::Cached(c) if c.dlid == p.dlid => hit.push(t1.elapsed()),
            other => return Err(format!("not cached after the answer: {other:?}")),
        }
    }
    let st = client.stats();
    println!(
        "bench client: {} sends for {count} misses, rmpp_acks {}, stray {}",
        st.sent - sent_before,
        st.rmpp_acks,
        st.stray
    );
    let raw_p50 = stats("raw-get", raw);
    let miss_p50 = stats("resolve-miss", miss);
    let hit_p50 = stats("resolve-hit", hit);
    // The physical limit of a miss is the raw round trip to the SA, measured above.
    println!(
        "bench ratio: resolve-miss / raw-get (p50) {:.2} (goal <= 1.1); resolve-hit p50 {:.2}us (goal <= 1 us)",
        miss_p50.as_secs_f64() / raw_p50.as_secs_f64().max(1e-9),
        hit_p50.as_secs_f64() * 1e6
    );
    Ok(())
}

fn run() -> Result<bool, String> {
    let args = Args(std::env::args().skip(1).collect());
    let cmd = args.0.first().cloned().unwrap_or_default();
    if cmd == "sm-watch" {
        // Its own SA agent (the library's): umad2sim has one agent per class per process.
        return sm::watch(&args);
    }
    let mut dev = Dev::open()?;
    let port = port_info()?;
    match cmd.as_str() {
        "info" => {
            println!(
                "lid {} sm_lid {} sm_sl {} gid {}",
                port.lid,
                port.sm_lid,
                port.sm_sl,
                Ipv6Addr::from(port.gid.0)
            );
            Ok(true)
        }
        "path" => {
            let q = query_of(&args)?;
            let mut client = client_for(&args, &port)?;
            let id = client.query(&q, Instant::now());
            let res = drive(&mut client, &mut dev, id)?;
            if let Some(f) = args.val("--save") {
                let m = dev.saved.ok_or("--save: nothing received")?;
                std::fs::write(f, m).map_err(|e| format!("{f}: {e}"))?;
                eprintln!(
                    "saved the first MAD received ({} bytes read) to {f}",
                    dev.saved_len
                );
            }
            let s = client.stats();
            eprintln!(
                "stats sent {} resent {} stray {} rmpp_segments {}",
                s.sent, s.resent, s.stray, s.rmpp_segments
            );
            match res {
                Ok(recs) => {
                    println!("records {}", recs.len());
                    for (i, r) in recs.iter().enumerate() {
                        println!("record {i}");
                        print_record(r);
                    }
                    Ok(true)
                }
                Err(e) => {
                    println!("error {e}");
                    Ok(false)
                }
            }
        }
        "repeat" => {
            // The same query --count times in a row: how many were answered, with how many
            // sends (a lossy link makes the client resend).
            let q = query_of(&args)?;
            let count = args.num("--count")?.unwrap_or(50);
            let mut client = client_for(&args, &port)?;
            let mut answered = 0;
            for _ in 0..count {
                let id = client.query(&q, Instant::now());
                if drive(&mut client, &mut dev, id)?.is_ok() {
                    answered += 1;
                }
            }
            let s = client.stats();
            println!(
                "answered {answered} of {count} sent {} resent {} timeouts {}",
                s.sent, s.resent, s.timeouts
            );
            Ok(answered == count)
        }
        "cache" => {
            // resolve() twice: a Get on the miss, the cache on the hit.
            let (Some(sg), Some(dg)) = (args.val("--sgid"), args.val("--dgid")) else {
                return Err("cache needs --sgid and --dgid".into());
            };
            let (sgid, dgid) = (parse_gid(sg)?, parse_gid(dg)?);
            let pkey = Pkey(args.num("--pkey")?.unwrap_or(0xffff) as u16);
            let sl = U4::masked(args.num("--sl")?.unwrap_or(0) as u8);
            let mut client = client_for(&args, &port)?;
            let first = match client.resolve(sgid, dgid, pkey, sl, Instant::now()) {
                Resolve::Pending(id) => drive(&mut client, &mut dev, id)?
                    .map_err(|e| e.to_string())?
                    .first()
                    .copied()
                    .ok_or("no path")?,
                Resolve::Cached(_) => return Err("cached before any query".into()),
            };
            let second = match client.resolve(sgid, dgid, pkey, sl, Instant::now()) {
                Resolve::Cached(p) => p,
                Resolve::Pending(_) => return Err("not cached after the answer".into()),
            };
            let s = client.stats();
            println!(
                "sent {} cache_hits {} cache_misses {} same {}",
                s.sent,
                s.cache_hits,
                s.cache_misses,
                first == second
            );
            Ok(first == second && s.sent == 1)
        }
        "bench" => bench(&args, &port, &mut dev).map(|()| true),
        "cm-listen" => cm::listen(&args, &port, dev),
        "cm-connect" => cm::connect(&args, &port, dev),
        "cm-async-listen" => cm_async::listen(&args, &port, dev),
        "cm-async-connect" => cm_async::connect(&args, &port, dev),
        _ => Err(
            "usage: ib-fabric-probe info | path ... | repeat ... | cache ... | bench ... \
                  | cm-listen ... | cm-connect ... | cm-async-listen ... | cm-async-connect ... \
                  | sm-watch ..."
                .into(),
        ),
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("ib-fabric-probe: {e}");
            ExitCode::from(2)
        }
    }
}
