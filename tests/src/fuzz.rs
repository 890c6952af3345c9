//! Bodies of the fuzz targets. Each takes arbitrary bytes and must never panic; the
//! round-trip target also checks an invariant. The cargo-fuzz harnesses in `fuzz/` and the
//! stable replay test `tests/tests/fuzz_replay.rs` both call these functions.

use ibcm_mad::capture::CaptureReader;
use ibcm_mad::cma::CmaHeader;
use ibcm_mad::frame;
use ibcm_mad::{AttrId, CmMessage, Mad, MadHeader};

/// Link types the `frame_decode` target chooses from with its first input byte.
pub const LINK_TYPES: [u32; 8] = [1, 101, 228, 229, 113, 276, 247, 197];

/// `mad_parse`: every MAD parser on arbitrary bytes.
pub fn mad_parse(data: &[u8]) {
    let _ = MadHeader::parse(data);
    if let Ok(m) = Mad::parse(data) {
        let _ = m.msg.to_string();
        let _ = m.msg.local_comm_id();
        let _ = m.msg.is_xrc();
    }
    if let Some((&sel, rest)) = data.split_first() {
        let attr = AttrId::from_raw(0x10 + u16::from(sel % 12));
        if let Ok(m) = CmMessage::parse(attr, rest) {
            let _ = m.to_string();
        }
    }
    let _ = CmaHeader::parse(data);
}

/// `mad_roundtrip`: parse → emit → parse gives the same message, and emitting is stable.
pub fn mad_roundtrip(data: &[u8]) {
    let Ok(m) = Mad::parse(data) else {
        return;
    };
    let bytes = m.to_bytes();
    let again = Mad::parse(&bytes).expect("an emitted MAD must parse");
    assert_eq!(m, again, "parse(emit(parse(x))) != parse(x)");
    assert_eq!(again.to_bytes(), bytes, "emit is not stable");
    if let Ok(h) = CmaHeader::parse(data) {
        let mut out = [0u8; 36];
        h.emit(&mut out).expect("36-byte buffer");
        assert_eq!(CmaHeader::parse(&out).expect("emitted header parses"), h);
    }
}

/// `frame_decode`: the first byte picks a link type, the rest is a captured frame.
pub fn frame_decode(data: &[u8]) {
    let Some((&sel, frame_bytes)) = data.split_first() else {
        return;
    };
    let lt = LINK_TYPES[usize::from(sel) % LINK_TYPES.len()];
    if let Ok(frame::Decoded::Ib(p)) = frame::decode(lt, frame_bytes) {
        let _ = p.verify_icrc();
        let _ = p.src_qp();
        if let Some(Ok(mad)) = p.mad() {
            mad_parse(mad);
        }
    }
}

/// `capture_read`: arbitrary bytes as a capture file; every record is classified.
pub fn capture_read(data: &[u8]) {
    let Ok(mut r) = CaptureReader::new(data) else {
        return;
    };
    let mut n = 0;
    while let Some(rec) = r.next_record() {
        match rec {
            Ok(rec) => {
                let _ = ibcm_tools::trace::classify(&rec);
            }
            Err(_) => break,
        }
        n += 1;
        if n > 10_000 {
            break;
        }
    }
}

/// A fuzz target body.
pub type Target = fn(&[u8]);

/// All targets by name.
pub const TARGETS: [(&str, Target); 4] = [
    ("mad_parse", mad_parse),
    ("mad_roundtrip", mad_roundtrip),
    ("frame_decode", frame_decode),
    ("capture_read", capture_read),
];
