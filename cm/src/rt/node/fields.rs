//! The most each field of a request may carry ([`check`]): private data and ARI at the CM's
//! MAD maxima, the MAD bodies at their size, names and lists at small documented bounds. A
//! longer field is refused with its name and length, never its content.

use ibcm_mad::cma::CmaHeader;
use ibcm_mad::{Dreq, Rej, Rep, Req, Rtu, SidrRep, SidrReq, MAD_DATA_LEN};

use super::proto::{Op, WireAccept};
use super::sidr::too_long;

/// The longest XRC policy name ([`Op::XrcListen`]; the known ones are shorter).
pub const MAX_POLICY_NAME: usize = 32;

/// The longest domain name of an [`Op::XrcListen`].
pub const MAX_DOMAIN_NAME: usize = 256;

/// The longest keeper request of an [`Op::Keeper`], as JSON (names, paths and attributes
/// are short; the whole request is held only while it is served).
pub const MAX_KEEPER_REQUEST: usize = 4096;

/// The most SRQ numbers of an [`Op::XrcListen`] (the REP's 1..=47).
pub const MAX_SRQNS: usize = 47;

/// The most transports of an [`Op::Listen`] (RC, UC, XRC).
pub const MAX_TRANSPORTS: usize = 3;

/// The most additional information of a SIDR_REP ([`Op::SidrReply`]).
pub const MAX_SIDR_ADDITIONAL_INFO: usize = 72;

/// Why `op` carries a field above its maximum, if it does.
pub(super) fn check(op: &Op) -> Result<(), String> {
    match op {
        Op::Connect { params } => {
            at_most("the REQ body", params.req.len(), MAD_DATA_LEN)?;
            at_most(
                "REQ private data",
                params.private_data.len(),
                Req::PRIVATE_DATA_LEN,
            )?;
            at_most(
                "the rdma_cm header",
                params.cma.as_ref().map_or(0, Vec::len),
                CmaHeader::LEN,
            )
        }
        Op::Listen { transports, .. } => {
            at_most("the transport list", transports.len(), MAX_TRANSPORTS)
        }
        Op::ListenStateless {
            transports,
            template,
            ..
        } => {
            at_most("the transport list", transports.len(), MAX_TRANSPORTS)?;
            accept(&template.accept)
        }
        Op::Accept { params, .. } => accept(params),
        Op::Reject {
            ari, private_data, ..
        } => {
            at_most("the REJ's ARI", ari.len(), Rej::ARI_LEN)?;
            at_most(
                "REJ private data",
                private_data.len(),
                Rej::PRIVATE_DATA_LEN,
            )
        }
        Op::Establish { private_data, .. } => at_most(
            "RTU private data",
            private_data.len(),
            Rtu::PRIVATE_DATA_LEN,
        ),
        Op::Disconnect { private_data, .. } => at_most(
            "DREQ private data",
            private_data.len(),
            Dreq::PRIVATE_DATA_LEN,
        ),
        Op::XrcListen {
            policy,
            srqns,
            domain,
            ..
        } => {
            at_most("the policy name", policy.len(), MAX_POLICY_NAME)?;
            at_most(
                "the domain name",
                domain.as_ref().map_or(0, String::len),
                MAX_DOMAIN_NAME,
            )?;
            at_most("the SRQ number list", srqns.len(), MAX_SRQNS)
        }
        Op::Sidr { req } => at_most(
            "SIDR_REQ private data",
            req.private_data.len(),
            SidrReq::PRIVATE_DATA_LEN,
        ),
        Op::SidrReply { rep, .. } => {
            at_most(
                "SIDR_REP private data",
                rep.private_data.len(),
                SidrRep::PRIVATE_DATA_LEN,
            )?;
            at_most(
                "SIDR_REP additional information",
                rep.additional_info.len(),
                MAX_SIDR_ADDITIONAL_INFO,
            )
        }
        Op::Hello { .. }
        | Op::Unlisten { .. }
        | Op::Mra { .. }
        | Op::Unanswered { .. }
        | Op::PendingDropped { .. }
        | Op::RandomPsn
        | Op::Len
        | Op::XrcUnlisten { .. }
        | Op::XrcDestroy
        | Op::XrcOrphans
        | Op::XrcReclaim { .. }
        | Op::Stats
        | Op::ResolvePath { .. }
        | Op::LapPolicy { .. }
        | Op::PathMigrated { .. } => Ok(()),
        Op::LoadAltPath { lap, .. } => at_most("the LAP body", lap.len(), MAD_DATA_LEN),
        Op::Apr { apr, .. } => {
            at_most(
                "APR additional information",
                apr.additional_info.len(),
                super::lap::MAX_APR_ADDITIONAL_INFO,
            )?;
            at_most(
                "APR private data",
                apr.private_data.len(),
                super::lap::MAX_APR_PRIVATE_DATA,
            )
        }
        Op::Keeper { req } => at_most(
            "the keeper request",
            req.to_string().len(),
            MAX_KEEPER_REQUEST,
        ),
    }
}

/// An accept's fields (an [`Op::Accept`], a stateless listener's template).
fn accept(params: &WireAccept) -> Result<(), String> {
    at_most("the REP body", params.rep.len(), MAD_DATA_LEN)?;
    at_most(
        "REP private data",
        params.private_data.len(),
        Rep::PRIVATE_DATA_LEN,
    )
}

fn at_most(what: &str, len: usize, max: usize) -> Result<(), String> {
    if len > max {
        Err(too_long(what, len, max))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_over_its_maximum_is_named_not_echoed() {
        let op = Op::XrcListen {
            service_id: 1,
            policy: "x".repeat(60_000),
            srqns: vec![1],
            domain: None,
            tgt_qpn: None,
        };
        let why = check(&op).unwrap_err();
        assert_eq!(
            why,
            "the policy name of 60000 bytes is above its maximum of 32"
        );
        let op = Op::Reject {
            conn: 1,
            reason: 28,
            ari: vec![0; 72],
            private_data: vec![0; 149],
        };
        assert!(check(&op)
            .unwrap_err()
            .starts_with("REJ private data of 149"));
        let op = Op::Establish {
            conn: 1,
            private_data: vec![0; 224],
        };
        assert!(check(&op).is_ok());
        let op = Op::Disconnect {
            conn: 1,
            private_data: vec![0; 221],
        };
        assert!(check(&op).is_err());
        let apr = |info: usize, pd: usize| Op::Apr {
            conn: 1,
            apr: super::super::lap::WireApr {
                status: 0,
                additional_info: vec![0; info],
                private_data: vec![0; pd],
            },
        };
        assert!(check(&apr(72, 148)).is_ok());
        assert_eq!(
            check(&apr(73, 0)).unwrap_err(),
            "APR additional information of 73 bytes is above its maximum of 72"
        );
        assert!(check(&apr(0, 149))
            .unwrap_err()
            .starts_with("APR private data of 149"));
        let lap = |n: usize| Op::LoadAltPath {
            conn: 1,
            lap: vec![0; n],
        };
        assert!(check(&lap(232)).is_ok());
        assert!(check(&lap(233))
            .unwrap_err()
            .starts_with("the LAP body of 233"));
    }
}
