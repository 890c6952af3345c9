//! The per-MAD JSON keys that carry every remaining CM field (schema 3, added in cm-trace v3
//! §3): connection parameters (MTU, timeouts, retry counts, responder resources, …), the
//! paths with their GIDs and flow labels, REJ / APR / SIDR_REP additional information, the
//! private data in hex, and the decoded XRC block. The keys are listed in `render.rs`.
//!
//! A MAD cut by the snaplen gets only the groups it holds completely (the REQ's scalar fields
//! from MAD byte 76, its primary path from 120, its alternate path from 164, the REP's fields
//! from 52); the other keys of this module, the private data included, need the whole MAD.

use ibcm_mad::xrc::XrcBlock;
use ibcm_mad::{CmMessage, Gid, PathInfo};

use std::io::Write;

use crate::put::{put_ipv4, put_json_str, put_u64};

/// Hex digit pairs of each byte value (first digit in the lowest byte).
// Indexing in a const initialiser cannot panic at run time.
#[allow(clippy::indexing_slicing)]
const HEX: [u16; 256] = {
    const D: &[u8; 16] = b"0123456789abcdef";
    let mut t = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = D[i >> 4] as u16 | (D[i & 15] as u16) << 8;
        i += 1;
    }
    t
};

/// `,"key":` as a literal.
macro_rules! key {
    ($k:literal) => {
        concat!(",\"", $k, "\":").as_bytes()
    };
}

#[inline(always)]
fn num(out: &mut Vec<u8>, key: &[u8], v: u64) {
    out.extend_from_slice(key);
    put_u64(out, v);
}

#[inline(always)]
fn boolean(out: &mut Vec<u8>, key: &[u8], v: bool) {
    out.extend_from_slice(key);
    out.extend_from_slice(if v { b"true" } else { b"false" });
}

#[inline(always)]
fn name(out: &mut Vec<u8>, key: &[u8], v: &str) {
    out.extend_from_slice(key);
    out.push(b'"');
    out.extend_from_slice(v.as_bytes());
    out.push(b'"');
}

/// Eight bytes (big-endian in `v`) as 16 lower-case hex digits, first digit in the lowest
/// byte of the result: nibbles spread to bytes, then `0`–`9` / `a`–`f` added without branches.
#[inline(always)]
fn hex8(v: u64) -> u128 {
    // Spread the 16 nibbles of `v` into the 16 bytes of a u128, most significant nibble first
    // in memory (little-endian: lowest byte).
    let b = v.to_be_bytes();
    let mut nib = [0u8; 16];
    for (i, x) in b.iter().enumerate() {
        if let Some(pair) = nib.get_mut(2 * i..2 * i + 2) {
            pair.copy_from_slice(&[x >> 4, x & 0xf]);
        }
    }
    let n = u128::from_le_bytes(nib);
    // Per byte: '0' + n, plus ('a' - '0' - 10) where n > 9 (n + 6 sets bit 4 exactly then).
    let ones = u128::from_le_bytes([1; 16]);
    let over9 = ((n + 6 * ones) >> 4) & ones;
    n + 0x30 * ones + over9 * 39
}

/// Appends `bytes` as lower-case hex (no separator).
pub(crate) fn put_hex_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.reserve(bytes.len() * 2);
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        out.extend_from_slice(&hex8(u64::from_be_bytes(w)).to_le_bytes());
    }
    for &b in chunks.remainder() {
        out.extend_from_slice(&HEX.get(usize::from(b)).copied().unwrap_or(0).to_le_bytes());
    }
}

/// The length of `bytes` without its trailing zero bytes (eight at a time).
fn trimmed_len(bytes: &[u8]) -> usize {
    let mut end = bytes.len();
    while end >= 8 {
        let Some(w) = bytes.get(end - 8..end) else {
            break;
        };
        if w.iter().fold(0u8, |a, &b| a | b) != 0 {
            break;
        }
        end -= 8;
    }
    bytes
        .get(..end)
        .and_then(|b| b.iter().rposition(|&x| x != 0))
        .map_or(0, |i| i + 1)
}

/// `,"key":"hex"` with the trailing zero bytes left out (an all-zero field is `""`).
fn hex_trimmed(out: &mut Vec<u8>, key: &[u8], bytes: &[u8]) {
    let end = trimmed_len(bytes);
    out.extend_from_slice(key);
    out.push(b'"');
    put_hex_bytes(out, bytes.get(..end).unwrap_or(&[]));
    out.push(b'"');
}

fn gid(out: &mut Vec<u8>, key: &[u8], g: &Gid) {
    out.extend_from_slice(key);
    out.push(b'"');
    match g.to_ipv6().to_ipv4_mapped() {
        Some(v4) => {
            out.extend_from_slice(b"::ffff:");
            put_ipv4(out, v4);
        }
        None => {
            let _ = write!(out, "{g}");
        }
    }
    out.push(b'"');
}

/// A path object (REQ primary / alternate, LAP alternate).
fn path(out: &mut Vec<u8>, key: &[u8], p: &PathInfo) {
    out.extend_from_slice(key);
    out.extend_from_slice(b"{\"local_lid\":");
    put_u64(out, u64::from(p.local_lid.0));
    num(out, key!("remote_lid"), u64::from(p.remote_lid.0));
    gid(out, key!("local_gid"), &p.local_gid);
    gid(out, key!("remote_gid"), &p.remote_gid);
    num(out, key!("flow_label"), u64::from(p.flow_label.get()));
    num(out, key!("packet_rate"), u64::from(p.packet_rate.raw()));
    name(out, key!("packet_rate_name"), p.packet_rate.name());
    num(out, key!("traffic_class"), u64::from(p.traffic_class));
    num(out, key!("hop_limit"), u64::from(p.hop_limit));
    num(out, key!("sl"), u64::from(p.sl.get()));
    boolean(out, key!("subnet_local"), p.subnet_local);
    num(
        out,
        key!("local_ack_timeout"),
        u64::from(p.local_ack_timeout.get()),
    );
    out.push(b'}');
}

/// Whether a path is present (IBTA: an alternate path of all zeros is none).
fn path_present(p: &PathInfo) -> bool {
    p.remote_lid.0 != 0 || p.local_lid.0 != 0 || p.remote_gid != Gid::default()
}

/// The decoded XRC block: `"xrc_block":{"kind":…,"fields":{name: value, …}}`, or
/// `"xrc_block_error"` for a block with the marker that does not parse.
fn xrc_block(out: &mut Vec<u8>, msg: &CmMessage) {
    match XrcBlock::find(msg) {
        None => {}
        Some(Ok(b)) => {
            out.extend_from_slice(key!("xrc_block"));
            out.extend_from_slice(b"{\"kind\":");
            put_json_str(out, b.name());
            num(out, key!("len"), b.len() as u64);
            out.extend_from_slice(key!("fields"));
            out.push(b'{');
            for (i, f) in b.fields().iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                put_json_str(out, f.name);
                out.push(b':');
                put_json_str(out, &f.value);
            }
            out.extend_from_slice(b"}}");
        }
        Some(Err(e)) => {
            out.extend_from_slice(key!("xrc_block_error"));
            put_json_str(out, &e.to_string());
        }
    }
}

/// Appends the keys of this module for `msg`; `have`: MAD bytes captured.
pub(crate) fn full_fields(out: &mut Vec<u8>, msg: &CmMessage, have: usize) {
    let whole = have >= 256;
    match msg {
        CmMessage::Req(r) => {
            if have >= 76 {
                num(out, key!("qkey"), u64::from(r.local_qkey.0));
                num(
                    out,
                    key!("responder_resources"),
                    u64::from(r.responder_resources),
                );
                num(out, key!("initiator_depth"), u64::from(r.initiator_depth));
                if r.remote_eecn.get() != 0 {
                    num(out, key!("remote_eecn"), u64::from(r.remote_eecn.get()));
                }
                num(
                    out,
                    key!("remote_cm_response_timeout"),
                    u64::from(r.remote_cm_response_timeout.get()),
                );
                num(
                    out,
                    key!("local_cm_response_timeout"),
                    u64::from(r.local_cm_response_timeout.get()),
                );
                boolean(out, key!("flow_control"), r.end_to_end_flow_control);
                num(out, key!("retry_count"), u64::from(r.retry_count.get()));
                num(
                    out,
                    key!("rnr_retry_count"),
                    u64::from(r.rnr_retry_count.get()),
                );
                num(
                    out,
                    key!("max_cm_retries"),
                    u64::from(r.max_cm_retries.get()),
                );
                num(out, key!("pkey"), u64::from(r.partition_key.0));
                match r.path_mtu.bytes() {
                    Some(b) => num(out, key!("mtu"), u64::from(b)),
                    None => num(out, key!("mtu_code"), u64::from(r.path_mtu.raw())),
                }
                boolean(out, key!("srq"), r.srq);
                if r.ece_vendor_id.get() != 0 {
                    num(out, key!("ece_vendor_id"), u64::from(r.ece_vendor_id.get()));
                }
            }
            if have >= 120 {
                path(out, key!("primary_path"), &r.primary_path);
            }
            if have >= 164 && path_present(&r.alternate_path) {
                path(out, key!("alternate_path"), &r.alternate_path);
            }
            if whole {
                hex_trimmed(out, key!("private_data"), r.private_data.as_bytes());
            }
        }
        CmMessage::Rep(r) => {
            if have >= 52 {
                num(out, key!("qkey"), u64::from(r.local_qkey.0));
                num(
                    out,
                    key!("responder_resources"),
                    u64::from(r.responder_resources),
                );
                num(out, key!("initiator_depth"), u64::from(r.initiator_depth));
                num(
                    out,
                    key!("target_ack_delay"),
                    u64::from(r.target_ack_delay.get()),
                );
                name(out, key!("failover"), r.failover_accepted.name());
                boolean(out, key!("flow_control"), r.end_to_end_flow_control);
                num(
                    out,
                    key!("rnr_retry_count"),
                    u64::from(r.rnr_retry_count.get()),
                );
                boolean(out, key!("srq"), r.srq);
                if r.ece_vendor_id.get() != 0 {
                    num(out, key!("ece_vendor_id"), u64::from(r.ece_vendor_id.get()));
                }
            }
            if whole {
                hex_trimmed(out, key!("private_data"), r.private_data.as_bytes());
            }
        }
        _ if !whole => {}
        CmMessage::Rej(r) => {
            num(out, key!("ari_len"), u64::from(r.reject_info_length.get()));
            out.extend_from_slice(key!("ari"));
            out.push(b'"');
            put_hex_bytes(out, r.ari_bytes());
            out.push(b'"');
            hex_trimmed(out, key!("private_data"), r.private_data.as_bytes());
        }
        CmMessage::Mra(m) => hex_trimmed(out, key!("private_data"), m.private_data.as_bytes()),
        CmMessage::Rtu(m) => hex_trimmed(out, key!("private_data"), m.private_data.as_bytes()),
        CmMessage::Dreq(m) => hex_trimmed(out, key!("private_data"), m.private_data.as_bytes()),
        CmMessage::Drep(m) => hex_trimmed(out, key!("private_data"), m.private_data.as_bytes()),
        CmMessage::Lap(l) => {
            num(
                out,
                key!("remote_cm_response_timeout"),
                u64::from(l.remote_cm_response_timeout.get()),
            );
            path(out, key!("alternate_path"), &l.alternate_path);
            hex_trimmed(out, key!("private_data"), l.private_data.as_bytes());
        }
        CmMessage::Apr(a) => {
            num(out, key!("ap_status"), u64::from(a.ap_status.raw()));
            name(out, key!("ap_status_name"), a.ap_status.name());
            out.extend_from_slice(key!("additional_info"));
            out.push(b'"');
            put_hex_bytes(out, a.additional_info_bytes());
            out.push(b'"');
            hex_trimmed(out, key!("private_data"), a.private_data.as_bytes());
        }
        CmMessage::SidrReq(s) => {
            num(out, key!("pkey"), u64::from(s.partition_key.0));
            hex_trimmed(out, key!("private_data"), s.private_data.as_bytes());
        }
        CmMessage::SidrRep(s) => {
            name(out, key!("sidr_status_name"), s.status.name());
            num(out, key!("qkey"), u64::from(s.qkey.0));
            if s.ece_vendor_id.get() != 0 {
                num(out, key!("ece_vendor_id"), u64::from(s.ece_vendor_id.get()));
            }
            out.extend_from_slice(key!("additional_info"));
            out.push(b'"');
            put_hex_bytes(out, s.additional_info_bytes());
            out.push(b'"');
            hex_trimmed(out, key!("private_data"), s.private_data.as_bytes());
        }
        CmMessage::ClassPortInfo(c) => {
            num(out, key!("base_version"), u64::from(c.base_version));
            num(out, key!("class_version"), u64::from(c.class_version));
            num(out, key!("capability_mask"), u64::from(c.capability_mask));
            num(
                out,
                key!("capability_mask2"),
                u64::from(c.capability_mask2.get()),
            );
            num(
                out,
                key!("resp_time_value"),
                u64::from(c.resp_time_value.get()),
            );
            gid(out, key!("redirect_gid"), &c.redirect_gid);
            num(out, key!("redirect_lid"), u64::from(c.redirect_lid.0));
            num(out, key!("redirect_qp"), u64::from(c.redirect_qp.get()));
            num(out, key!("redirect_qkey"), u64::from(c.redirect_qkey.0));
            num(out, key!("redirect_pkey"), u64::from(c.redirect_pkey.0));
            gid(out, key!("trap_gid"), &c.trap_gid);
            num(out, key!("trap_lid"), u64::from(c.trap_lid.0));
            num(out, key!("trap_qp"), u64::from(c.trap_qp.get()));
        }
        CmMessage::Unknown { raw, .. } => {
            hex_trimmed(out, key!("attr_data"), raw.as_ref());
        }
    }
    if whole {
        xrc_block(out, msg);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_matches_format_and_trims() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for len in 0..40 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x >> 24) as u8
                })
                .collect();
            let mut out = Vec::new();
            put_hex_bytes(&mut out, &bytes);
            let want: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(String::from_utf8(out).unwrap(), want);
            let mut z = bytes.clone();
            z.extend([0u8; 19]);
            assert_eq!(
                trimmed_len(&z),
                bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1)
            );
        }
        let mut out = Vec::new();
        put_hex_bytes(&mut out, &[0xff; 8]);
        assert_eq!(out, b"ffffffffffffffff");
        let mut out = Vec::new();
        gid(&mut out, b"", &Gid::from_ip("10.1.2.3".parse().unwrap()));
        assert_eq!(out, b"\"::ffff:10.1.2.3\"");
        out.clear();
        gid(&mut out, b"", &Gid::from_ip("fe80::1".parse().unwrap()));
        assert_eq!(out, b"\"fe80::1\"");
    }

    #[test]
    fn hex_is_lower_case_and_trimmed() {
        let mut out = Vec::new();
        put_hex_bytes(&mut out, &[0x00, 0x0f, 0xa5, 0xff]);
        assert_eq!(out, b"000fa5ff");
        out.clear();
        hex_trimmed(&mut out, b",\"p\":", &[1, 0, 2, 0, 0]);
        assert_eq!(out, b",\"p\":\"010002\"");
        out.clear();
        hex_trimmed(&mut out, b",\"p\":", &[0, 0]);
        assert_eq!(out, b",\"p\":\"\"");
    }
}
