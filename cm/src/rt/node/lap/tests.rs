//! The node protocol's path-migration frames: encoding, decoding, compatibility.

use ibcm_mad::{Gid, Lid, Rate, TimeoutExp, U4};

use super::*;

fn path() -> PathInfo {
    PathInfo {
        local_lid: Lid(3),
        remote_lid: Lid(7),
        local_gid: Gid([1; 16]),
        remote_gid: Gid([2; 16]),
        flow_label: ibcm_mad::FlowLabel::masked(0x12345),
        packet_rate: Rate::G10,
        traffic_class: 0x20,
        hop_limit: 1,
        sl: U4::masked(5),
        subnet_local: true,
        local_ack_timeout: TimeoutExp::masked(19),
    }
}

/// A LAP body carries every field of the path and the private data, both ways; what it
/// cannot carry is refused with the endpoint's error, and a malformed body is an error,
/// not a panic.
#[test]
fn lap_bodies_round_trip() {
    let b = lap_body(&path(), b"go").unwrap();
    assert_eq!(b.len(), MAD_DATA_LEN);
    assert_eq!(parse_lap_body(&b), Ok((path(), b"go".to_vec())));
    let e = lap_body(&path(), &[1; 169]).unwrap_err();
    assert_eq!(
        e,
        CallError::TooLong {
            what: "LAP private data",
            len: 169,
            max: 168
        }
    );
    assert!(lap_body(&path(), &[1; 168]).is_ok());
    for bad in [&b[..231], &[][..], &[0; 233][..]] {
        assert!(parse_lap_body(bad).is_err(), "{}", bad.len());
    }
}

/// The APR's fields and the results of a LAP sent, as the handle's caller gets them.
#[test]
fn aprs_and_their_results() {
    let a = AprAnswer {
        status: AprStatus::InvalidLid,
        additional_info: vec![1, 2],
        private_data: b"no".to_vec(),
    };
    let w = WireApr::from_answer(&a);
    assert_eq!(
        serde_json::to_string(&w).unwrap(),
        r#"{"status":7,"additional_info":[1,2],"private_data":[110,111]}"#
    );
    assert_eq!(w.to_answer(), a);
    assert!(matches!(
        apr_result(WireResult::Apr(w)),
        Err(CmError::LapRejected(x)) if x == a
    ));
    let ok = WireApr::bare(AprStatus::Success);
    assert!(matches!(apr_result(WireResult::Apr(ok)), Ok(x) if x.status == AprStatus::Success));
    assert!(matches!(
        apr_result(WireResult::LapTimedOut),
        Err(CmError::LapTimedOut)
    ));
    let e = apr_result(WireResult::CallError(WireCallError::UnknownConnection {
        conn: 7,
    }));
    assert!(matches!(
        e,
        Err(CmError::Call(CallError::UnknownConnection(c))) if c.0 == 7
    ));
    assert!(matches!(
        apr_result(WireResult::Ok),
        Err(CmError::Refused(w)) if w.contains("unexpected")
    ));
    assert_eq!(apr_too_long(&[0; 72], &[0; 148]), None);
    assert!(matches!(
        apr_too_long(&[0; 73], &[]),
        Some(CallError::TooLong {
            what: "APR additional info",
            len: 73,
            max: 72
        })
    ));
    assert!(matches!(
        apr_too_long(&[], &[0; 149]),
        Some(CallError::TooLong {
            what: "APR private data",
            len: 149,
            max: 148
        })
    ));
}
