//! `sm-watch`: the SA client of the shipped library ([`Sa::open`] with a port watch) across
//! an SM restart.
//!
//! ```text
//! ib-fabric-probe sm-watch --dgid GID [--secs S] [--every-ms W]
//! ```
//! Resolves the path to `--dgid` every 100 ms for `--secs` (default 30) seconds through one
//! [`Sa`] whose port watch re-reads the port's sysfs attributes every `--every-ms` (default
//! 200). Prints a line when the SM LID it sees changes (`sm_lid A -> B`), the first path
//! resolved after that (`re-resolved dlid D from the SA at LID B`), and last
//! `sm-watch resolves R errors E port_changes C cache_hits H cache_misses M sm_lid L dlid D`.
//! It stops early, 1 s after a path was re-resolved following a change.

use std::net::Ipv6Addr;
use std::time::{Duration, Instant};

use ibcm::rt::sa::Sa;
use ibcm::rt::umad::IbPort;
use ibcm::sa::SaConfig;
use ibcm_mad::U4;

use super::{parse_gid, Args};

const UMAD: &str = "/dev/infiniband/umad0";

/// `sm-watch`.
pub(crate) fn watch(args: &Args) -> Result<bool, String> {
    let dgid = parse_gid(args.val("--dgid").ok_or("sm-watch needs --dgid")?)?;
    let secs = args.num("--secs")?.unwrap_or(30);
    let every = Duration::from_millis(args.num("--every-ms")?.unwrap_or(200));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio: {e}"))?;
    rt.block_on(async move {
        let port = IbPort::of_umad(UMAD).map_err(|e| e.to_string())?;
        let mut cfg = SaConfig::new(port.port, port.sm_lid);
        cfg.timeout = Duration::from_millis(200);
        cfg.retries = 2;
        let sa = Sa::open(UMAD, &port, cfg, Some(every)).map_err(|e| e.to_string())?;
        println!(
            "watching lid {} sm_lid {}, path to {}",
            port.lid,
            port.sm_lid,
            Ipv6Addr::from(dgid.0)
        );
        let deadline = Instant::now() + Duration::from_secs(secs);
        let (mut resolves, mut errors, mut changes) = (0u64, 0u64, 0u64);
        let (mut sm_lid, mut dlid) = (port.sm_lid, None);
        let mut done_at = None;
        while Instant::now() < deadline && done_at.is_none_or(|t| Instant::now() < t) {
            match sa.resolve(port.gid, dgid, port.pkey0, U4::masked(0)).await {
                Ok(p) => {
                    resolves += 1;
                    dlid = Some(p.dlid);
                }
                Err(e) => {
                    errors += 1;
                    println!("resolve: {e}");
                }
            }
            let st = sa.stats().await.ok_or("the SA task ended")?;
            if st.port_changes > changes {
                changes = st.port_changes;
                let now = IbPort::of_umad(UMAD).map_err(|e| e.to_string())?;
                println!("sm_lid {} -> {}", sm_lid, now.sm_lid);
                sm_lid = now.sm_lid;
                // The next resolve misses the flushed cache: a Get to the new SA.
                match sa.resolve(port.gid, dgid, port.pkey0, U4::masked(0)).await {
                    Ok(p) => {
                        resolves += 1;
                        dlid = Some(p.dlid);
                        println!("re-resolved dlid {} from the SA at LID {}", p.dlid, sm_lid);
                        done_at = Some(Instant::now() + Duration::from_secs(1));
                    }
                    Err(e) => {
                        errors += 1;
                        println!("re-resolve: {e}");
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let st = sa.stats().await.ok_or("the SA task ended")?;
        println!(
            "sm-watch resolves {resolves} errors {errors} port_changes {} cache_hits {} cache_misses {} sm_lid {} dlid {}",
            st.port_changes,
            st.cache_hits,
            st.cache_misses,
            sm_lid,
            dlid.map_or(0, |l| l.0)
        );
        Ok(st.port_changes > 0 && done_at.is_some())
    })
}
