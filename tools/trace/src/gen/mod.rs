//! Large synthetic CM captures for benchmarks, built from real ones.
//!
//! Each template is the CM exchange of one real RoCEv2 capture (Ethernet link type, one
//! connection per file: the public captures in `fixtures/captures/real/` and the kernel-made
//! ones in `fixtures/captures/kernel/`). Instance *i* of a template replays its frames with
//! the original addresses, ports, P_Key, PSNs and relative timing, starting `spacing × i` after
//! the first, with every comm ID replaced by one unique to the instance (and the TIDs that
//! carry a comm ID rewritten to match), so each instance is a distinct connection. Frames are
//! re-emitted with [`RoceV2UdRepr::emit_frame`], so IP checksums and ICRCs are valid. Output
//! is in time order; memory is bounded by the number of overlapping instances.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod sa_scenario;
mod scenario;

pub use sa_scenario::{sa_scenario, NAME as SA_SCENARIO};
pub use scenario::{data_scenario, NAME as DATA_SCENARIO};

use crate::capture::{CaptureReader, PcapFileWriter, TsResolution};
use ibcm_mad::frame::{self, EthernetRepr, RoceV2UdRepr, L2};
use ibcm_mad::{CmMessage, CommId, Mad, Tid};

/// LINKTYPE_ETHERNET.
const ETHERNET: u32 = 1;

#[derive(Debug, Clone)]
struct TFrame {
    offset: Duration,
    eth: EthernetRepr,
    roce: RoceV2UdRepr,
    mad: Mad,
}

/// The CM frames of one real connection.
#[derive(Debug, Clone)]
pub struct Template {
    /// Where it came from.
    pub name: String,
    frames: Vec<TFrame>,
    /// The distinct non-zero comm IDs, in order of appearance.
    ids: Vec<u32>,
}

impl Template {
    /// Number of CM frames.
    pub fn len(&self) -> usize {
        self.frames.len()
    }

    /// Whether the template has no frames.
    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }
}

fn comm_ids_mut(msg: &mut CmMessage) -> Vec<&mut CommId> {
    match msg {
        CmMessage::Req(m) => vec![&mut m.local_comm_id],
        CmMessage::Mra(m) => vec![&mut m.local_comm_id, &mut m.remote_comm_id],
        CmMessage::Rej(m) => vec![&mut m.local_comm_id, &mut m.remote_comm_id],
        CmMessage::Rep(m) => vec![&mut m.local_comm_id, &mut m.remote_comm_id],
        CmMessage::Rtu(m) => vec![&mut m.local_comm_id, &mut m.remote_comm_id],
        CmMessage::Dreq(m) => vec![&mut m.local_comm_id, &mut m.remote_comm_id],
        CmMessage::Drep(m) => vec![&mut m.local_comm_id, &mut m.remote_comm_id],
        CmMessage::Lap(m) => vec![&mut m.local_comm_id, &mut m.remote_comm_id],
        CmMessage::Apr(m) => vec![&mut m.local_comm_id, &mut m.remote_comm_id],
        _ => Vec::new(),
    }
}

/// Reads the RoCEv2 CM frames of an Ethernet capture as a template.
///
/// # Errors
/// The file cannot be read, is not Ethernet, or has no RoCEv2 CM frame.
pub fn load_template(path: &Path) -> Result<Template, String> {
    let name = path.display().to_string();
    let mut r = CaptureReader::open(path).map_err(|e| format!("{name}: {e}"))?;
    let mut frames = Vec::new();
    let mut ids: Vec<u32> = Vec::new();
    let mut t0 = None;
    while let Some(rec) = r.next_record() {
        let rec = rec.map_err(|e| format!("{name}: {e}"))?;
        if rec.link_type != ETHERNET {
            return Err(format!(
                "{name}: link type {} is not Ethernet",
                rec.link_type
            ));
        }
        let Ok(frame::Decoded::Ib(p)) = frame::decode(rec.link_type, rec.data) else {
            continue;
        };
        let (Some(ip), Some(udp), Some(deth), L2::Ethernet(eth)) = (p.ip, p.udp, p.deth, p.link.l2)
        else {
            continue;
        };
        let Some(Ok(raw)) = p.mad() else { continue };
        let Ok(mut mad) = Mad::parse(raw) else {
            continue;
        };
        for id in comm_ids_mut(&mut mad.msg) {
            if id.0 != 0 && !ids.contains(&id.0) {
                ids.push(id.0);
            }
        }
        let start = *t0.get_or_insert(rec.timestamp);
        frames.push(TFrame {
            offset: rec.timestamp.saturating_sub(start),
            eth,
            roce: RoceV2UdRepr {
                ip,
                udp,
                bth: p.bth,
                deth,
            },
            mad,
        });
    }
    if frames.is_empty() {
        return Err(format!("{name}: no RoCEv2 CM frames"));
    }
    Ok(Template { name, frames, ids })
}

/// The single-connection Ethernet captures under `fixtures/captures` (`real/` and `kernel/`)
/// that make up the default template mix.
pub fn default_template_paths(fixtures: &Path) -> Vec<PathBuf> {
    [
        "real/rocev2_mlx_nvme-discover.pcap",
        "real/rocev2_mlx_nvme-discover2.pcap",
        "real/rocev2_ibdump_write.pcap",
        "real/rocev2_ibdump_read2.pcap",
        "real/rocev2_ibdump_send.pcap",
        "kernel/establish_dreq_active.pcap",
        "kernel/establish_dreq_passive.pcap",
        "kernel/rej28_consumer_private_data.pcap",
        "kernel/rej8_no_listener.pcap",
        "kernel/mra_slow_accept.pcap",
        "kernel/req_retransmission_after_drop.pcap",
        "kernel/accept_without_qp.pcap",
        "kernel/xrc_handshake_no_qp.pcap",
        "kernel/rping_3.pcap",
    ]
    .iter()
    .map(|p| fixtures.join(p))
    .collect()
}

/// Generator settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenConfig {
    /// Stop after this many CM packets (at least).
    pub packets: u64,
    /// Time between the starts of two connections.
    pub spacing: Duration,
    /// Capture time of the first packet (since the Unix epoch).
    pub start: Duration,
}

impl Default for GenConfig {
    fn default() -> Self {
        GenConfig {
            packets: 1_000_000,
            spacing: Duration::from_micros(500),
            start: Duration::from_secs(1_800_000_000),
        }
    }
}

/// What was generated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GenSummary {
    /// CM packets written.
    pub packets: u64,
    /// Connections (template instances).
    pub connections: u64,
    /// Bytes of packet data written.
    pub bytes: u64,
}

/// The comm ID of instance `i`, slot `k`: unique over instances and slots (an odd
/// multiplier is a bijection of the 32-bit numbers).
fn new_id(i: u64, k: usize) -> u32 {
    let n = i.wrapping_mul(8).wrapping_add(k as u64 + 1) as u32;
    n.wrapping_mul(0x9e37_79b1)
}

/// Frame `k` of `tp` as instance `inst` sends it: its comm IDs replaced by the instance's
/// (and the TIDs that carry a comm ID rewritten to match).
fn instance_mad(tp: &Template, inst: u64, k: usize) -> Option<(&TFrame, Mad)> {
    let f = tp.frames.get(k)?;
    let mut mad = f.mad;
    let map = |old: u32| -> u32 {
        match tp.ids.iter().position(|&x| x == old) {
            Some(slot) => new_id(inst, slot),
            None => old,
        }
    };
    for id in comm_ids_mut(&mut mad.msg) {
        if id.0 != 0 {
            id.0 = map(id.0);
        }
    }
    // Linux TIDs end in the byte-swapped comm ID of the sender.
    let low = (mad.header.tid.0 as u32).swap_bytes();
    if tp.ids.contains(&low) {
        mad.header.tid =
            Tid((mad.header.tid.0 & 0xffff_ffff_0000_0000) | u64::from(map(low).swap_bytes()));
    }
    Some((f, mad))
}

/// Writes a pcap (Ethernet, microsecond timestamps) with at least `cfg.packets` CM packets
/// built from `templates` (used in turn).
///
/// # Errors
/// No templates, or writing failed.
pub fn generate<W: Write>(
    templates: &[Template],
    cfg: &GenConfig,
    out: W,
) -> Result<GenSummary, String> {
    if templates.iter().all(Template::is_empty) {
        return Err("no templates".to_string());
    }
    let mut w =
        PcapFileWriter::new(out, ETHERNET, TsResolution::Micro).map_err(|e| e.to_string())?;
    let mut sum = GenSummary::default();
    // Pending frames: (time, instance, frame index).
    let mut heap: BinaryHeap<Reverse<(Duration, u64, usize)>> = BinaryHeap::new();
    let mut next_instance = 0u64;
    let mut scheduled = 0u64;
    let mut buf = vec![0u8; 2048];
    let tmpl = |i: u64| {
        let n = templates.len().max(1) as u64;
        templates.get(usize::try_from(i % n).unwrap_or(0))
    };
    let start_of = |i: u64| {
        cfg.start
            + cfg
                .spacing
                .saturating_mul(u32::try_from(i).unwrap_or(u32::MAX))
    };
    loop {
        // Schedule instances that start before the earliest pending frame.
        while scheduled < cfg.packets {
            let t = start_of(next_instance);
            let due = heap.peek().is_none_or(|Reverse((ht, _, _))| t <= *ht);
            if !due {
                break;
            }
            if let Some(tp) = tmpl(next_instance) {
                for (k, f) in tp.frames.iter().enumerate() {
                    heap.push(Reverse((t + f.offset, next_instance, k)));
                }
                scheduled += tp.frames.len() as u64;
                sum.connections += 1;
            }
            next_instance += 1;
        }
        let Some(Reverse((t, inst, k))) = heap.pop() else {
            break;
        };
        let Some(tp) = tmpl(inst) else { continue };
        let Some((f, mad)) = instance_mad(tp, inst, k) else {
            continue;
        };
        let bytes = mad.to_bytes();
        let n = f.roce.frame_len(&f.eth, bytes.len());
        if buf.len() < n {
            buf.resize(n, 0);
        }
        let written = f
            .roce
            .emit_frame(&f.eth, &bytes, &mut buf)
            .map_err(|e| format!("{}: {e}", tp.name))?;
        let data = buf.get(..written).unwrap_or(&[]);
        w.write(t, data).map_err(|e| e.to_string())?;
        sum.packets += 1;
        sum.bytes += written as u64;
    }
    w.into_inner().map_err(|e| e.to_string())?;
    Ok(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_distinct() {
        let mut seen = std::collections::HashSet::new();
        for i in 0..10_000 {
            for k in 0..4 {
                assert!(seen.insert(new_id(i, k)));
            }
        }
    }
}
