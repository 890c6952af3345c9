//! Paths to `lid:N` / `gid:G` peers from the local InfiniBand port's SA: [`PathResolver`]
//! (an [`Sa`] task and the port it asks from) and its errors ([`PathError`]). What
//! [`Cm::resolve_path`](crate::rt::Cm::resolve_path) uses in-process, and what the node
//! service's daemon answers its clients' path queries with.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ibcm_mad::sa::PathRecord;
use ibcm_mad::Pkey;

use super::Sa;
use crate::rt::umad::IbPort;
use crate::rt::UmadError;
use crate::sa::{PathTarget, SaConfig, SaError};

/// Why no path came back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PathError {
    /// There is no SA to ask: the CM endpoint is not on an InfiniBand port (RoCE or UDP,
    /// where peers are named by IP), or (in-process) it was given no [`PathResolver`]
    /// ([`Cm::set_path_resolver`](crate::rt::Cm::set_path_resolver)).
    #[error(
        "no SA to ask for paths: the CM endpoint is not on an InfiniBand port (lid: and gid: \
         peers need one, with a subnet manager)"
    )]
    NoSa,
    /// The node service is an older `ibcmd` that does not answer path queries.
    #[error("the node service does not answer path queries (an older ibcmd)")]
    NotServed,
    /// The node service is an older `ibcmd` that does not resolve alternate paths (it
    /// predates path migration through the node service).
    #[error(
        "the node service does not resolve alternate paths (an ibcmd that predates path migration)"
    )]
    AlternateNotServed,
    /// The local port has no LID or knows no SM (LID 0 or SM LID 0 when it was read): the
    /// subnet manager has not configured it.
    #[error(
        "the local port has no LID ({lid}) or no SM (SM LID {sm_lid}): is a subnet manager \
         running? (the port is read when the CM starts: restart it once the SM has \
         configured the port)"
    )]
    NoSm {
        /// The port's LID.
        lid: u16,
        /// The master SM's LID.
        sm_lid: u16,
    },
    /// The SA query failed: the SA's status (ERR_NO_RECORDS: no path to that port), no
    /// answer, an aborted transfer, too many queries at once.
    #[error("PathRecord query to the SA: {0}")]
    Sa(SaError),
    /// The SA answered the Get with no record, or with one that leads nowhere (DLID 0).
    #[error("the SA answered with no usable PathRecord (none, or DLID 0)")]
    NoRecord,
    /// The path's P_Key is not the local port's P_Key 0, the only partition the CM sends
    /// in (its P_Key index 0).
    #[error("the path's P_Key {pkey:#06x} is not the local port's P_Key 0 ({pkey0:#06x})")]
    PkeyMismatch {
        /// The path's.
        pkey: u16,
        /// The local port's P_Key 0.
        pkey0: u16,
    },
}

/// The port as last read, and when (shared by a resolver's clones).
type LastPort = Arc<Mutex<(Instant, IbPort)>>;

/// How often [`PathResolver::open`]'s SA task reads the port for an SM change.
pub(crate) const PORT_WATCH: std::time::Duration = std::time::Duration::from_secs(1);

/// Asks the SA of the local InfiniBand port for the path to a [`PathTarget`]: one PathRecord
/// Get per call (by SLID/DLID, or by SGID/DGID in the port's P_Key 0), no cache; the path
/// must be in the port's P_Key 0 (the CM sends with P_Key index 0,
/// [`cm_peer`](crate::sa::cm_peer)`(rec, 0)`). Clones share the [`Sa`] task.
#[derive(Debug, Clone)]
pub struct PathResolver {
    sa: Sa,
    port: IbPort,
    /// The umad device of [`PathResolver::open`], and the port as last read from it (at most
    /// once per [`PORT_WATCH`] for a query).
    dev: Option<(PathBuf, LastPort)>,
}

impl PathResolver {
    /// Over an [`Sa`] task that reaches `port`'s SM (its LID and SL in the task's
    /// [`SaConfig`]).
    pub fn new(sa: Sa, port: IbPort) -> Self {
        PathResolver {
            sa,
            port,
            dev: None,
        }
    }

    /// Opens the SA agent on the umad device `dev` of `port` (as [`IbPort::of_umad`] read
    /// it) and spawns its [`Sa`] task on the current tokio runtime ([`Sa::open`]: the SM's LID
    /// and SL from the port, 1 s per attempt and 3 retries, [`SaConfig::new`]), watching the
    /// port every second: after an SM change the queries go to the new SM. A
    /// [`resolve`](Self::resolve) reads the port from sysfs again when the last reading is a
    /// second old (or had no LID or SM), so a port the SM had not configured yet when this
    /// was opened is served once it has been, and a new LID is used.
    ///
    /// # Errors
    /// The device cannot be opened or the agent registered.
    pub fn open(dev: impl AsRef<Path>, port: &IbPort) -> Result<Self, UmadError> {
        let dev = dev.as_ref();
        let cfg = SaConfig::new(port.port, port.sm_lid);
        let sa = Sa::open(dev, port, cfg, Some(PORT_WATCH))?;
        Ok(PathResolver {
            sa,
            port: port.clone(),
            dev: Some((
                dev.to_path_buf(),
                Arc::new(Mutex::new((crate::rt::now(), port.clone()))),
            )),
        })
    }

    /// The port as sysfs gives it, read again when the last reading is older than
    /// [`PORT_WATCH`] or had no LID or SM; `None` without a device.
    fn current_port(&self) -> Option<IbPort> {
        let (dev, last) = self.dev.as_ref()?;
        let mut g = last.lock().unwrap_or_else(|e| e.into_inner());
        let (at, port) = &mut *g;
        let stale = crate::rt::now().saturating_duration_since(*at) >= PORT_WATCH
            || port.lid.0 == 0
            || port.sm_lid.0 == 0;
        if stale {
            if let Ok(p) = IbPort::of_umad(dev) {
                *port = p;
            }
            *at = crate::rt::now();
        }
        Some(port.clone())
    }

    /// The local port the paths start at.
    pub fn port(&self) -> &IbPort {
        &self.port
    }

    /// The path to `to` from the local port.
    ///
    /// # Errors
    /// [`PathError`]: [`NoSa`](PathError::NoSa) for a port that is not InfiniBand,
    /// [`NoSm`](PathError::NoSm), the SA's [`Sa`](PathError::Sa) error,
    /// [`NoRecord`](PathError::NoRecord), [`PkeyMismatch`](PathError::PkeyMismatch).
    pub async fn resolve(&self, to: PathTarget) -> Result<PathRecord, PathError> {
        // The port as it is now (a few small sysfs reads), else as it was read at the start.
        let now = self.current_port();
        let p = now.as_ref().unwrap_or(&self.port);
        if !p.is_infiniband() {
            return Err(PathError::NoSa);
        }
        if p.lid.0 == 0 || p.sm_lid.0 == 0 {
            return Err(PathError::NoSm {
                lid: p.lid.0,
                sm_lid: p.sm_lid.0,
            });
        }
        let q = to.query(p.lid, p.gid, p.pkey0);
        let recs = self.sa.path_records(q).await.map_err(PathError::Sa)?;
        let rec = recs
            .first()
            .copied()
            .filter(|r| r.dlid.0 != 0)
            .ok_or(PathError::NoRecord)?;
        check_pkey(&rec, p.pkey0)?;
        Ok(rec)
    }

    /// The path to `to` ([`resolve`](Self::resolve)) and an alternate one for Automatic Path
    /// Migration, if the SA has one: among the records of a GetTable by SGID/DGID (the
    /// primary's DGID, the port's P_Key 0, reversible, NumbPath
    /// [`ALTERNATE_CANDIDATES`]), the first with another SLID and another DLID than the
    /// primary ([`alternate_path`](crate::sa::alternate_path)), a DLID and the port's P_Key 0.
    /// `None` when every record shares a LID with the primary (a fabric whose SM gives each
    /// port one LID, LMC 0) or the SA has none. Two SA queries: the Get of `resolve`, then
    /// the GetTable.
    ///
    /// # Errors
    /// As [`resolve`](Self::resolve); the GetTable's own SA errors (but "no records": then
    /// there is no alternate).
    pub async fn resolve_with_alternate(
        &self,
        to: PathTarget,
    ) -> Result<(PathRecord, Option<PathRecord>), PathError> {
        let primary = self.resolve(to).await?;
        let now = self.current_port();
        let p = now.as_ref().unwrap_or(&self.port);
        let q = crate::sa::PathQuery {
            table: true,
            numb_path: ALTERNATE_CANDIDATES,
            ..crate::sa::PathQuery::by_gids(p.gid, primary.dgid, p.pkey0)
        };
        let recs = match self.sa.path_records(q).await {
            Ok(r) => r,
            Err(SaError::Status {
                sa: ibcm_mad::sa::SaStatus::NoRecords,
                ..
            }) => Vec::new(),
            Err(e) => return Err(PathError::Sa(e)),
        };
        let usable: Vec<PathRecord> = recs
            .into_iter()
            .filter(|r| r.dlid.0 != 0 && check_pkey(r, p.pkey0).is_ok())
            .collect();
        Ok((primary, crate::sa::alternate_path(&primary, &usable)))
    }
}

/// How many paths [`PathResolver::resolve_with_alternate`] asks the SA for (its GetTable's
/// NumbPath), as cm-ping's `--alt-path` does: with LMC 1 a port pair has four LID pairs.
pub const ALTERNATE_CANDIDATES: u8 = 4;

/// The path's P_Key is `pkey0` (membership bit aside).
fn check_pkey(rec: &PathRecord, pkey0: Pkey) -> Result<(), PathError> {
    if rec.pkey.0 & 0x7fff != pkey0.0 & 0x7fff {
        return Err(PathError::PkeyMismatch {
            pkey: rec.pkey.0,
            pkey0: pkey0.0,
        });
    }
    Ok(())
}

/// An [`IbPort`] for tests: `umad0` of `mlx5_0` port 1, InfiniBand, LID `lid`, the SM at
/// LID 1, GID fe80::`lid`, P_Key 0 0xFFFF.
#[cfg(test)]
pub(crate) fn test_port(lid: u16) -> IbPort {
    IbPort {
        device: "mlx5_0".into(),
        port: 1,
        link_layer: crate::rt::umad::LinkLayer::InfiniBand,
        lid: ibcm_mad::Lid(lid),
        lmc: 0,
        sm_lid: ibcm_mad::Lid(1),
        sm_sl: 0,
        gid: super::test_sa::gid(lid),
        pkey0: Pkey(0xffff),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ibcm_mad::sa::SaStatus;
    use ibcm_mad::{Gid, Lid};

    use super::super::test_sa::{self, FakeSa};
    use super::*;
    use crate::rt::umad::LinkLayer;

    fn resolver(fake: FakeSa, port: IbPort) -> PathResolver {
        let (sa, _seen) = test_sa::spawn(fake, Duration::from_millis(100));
        PathResolver::new(sa, port)
    }

    #[tokio::test(start_paused = true)]
    async fn a_lid_and_a_gid_resolve_from_the_local_port() {
        let r = resolver(FakeSa::default(), test_port(2));
        let rec = r.resolve(PathTarget::Lid(Lid(5))).await.unwrap();
        assert_eq!((rec.slid, rec.dlid), (Lid(2), Lid(5)));
        assert_eq!(rec.pkey, Pkey(0xffff));
        let rec = r.resolve(PathTarget::Gid(test_sa::gid(7))).await.unwrap();
        assert_eq!((rec.sgid, rec.dgid), (test_sa::gid(2), test_sa::gid(7)));
        assert_eq!(rec.dlid, Lid(7));
    }

    /// With LMC 1 the alternate path is the GetTable's record with other LIDs than the
    /// primary's; with LMC 0 (every record shares a LID with it) there is none.
    #[tokio::test(start_paused = true)]
    async fn an_alternate_path_has_other_lids() {
        let lmc = FakeSa {
            lmc: true,
            ..FakeSa::default()
        };
        let (sa, mut seen) = test_sa::spawn(lmc, Duration::from_millis(100));
        let r = PathResolver::new(sa, test_port(2));
        for to in [PathTarget::Lid(Lid(5)), PathTarget::Gid(test_sa::gid(5))] {
            let (p, alt) = r.resolve_with_alternate(to).await.unwrap();
            assert_eq!((p.slid, p.dlid), (Lid(2), Lid(5)), "{to:?}");
            let alt = alt.unwrap();
            assert_eq!((alt.slid, alt.dlid), (Lid(3), Lid(6)), "{to:?}");
            assert_eq!(alt.dgid, test_sa::gid(5));
        }
        let mut n = 0;
        while seen.try_recv().is_ok() {
            n += 1;
        }
        assert_eq!(n, 4, "a Get and a GetTable each");
        // LMC 0: the GetTable's one record is the primary's.
        let r = resolver(FakeSa::default(), test_port(2));
        let (p, alt) = r
            .resolve_with_alternate(PathTarget::Lid(Lid(5)))
            .await
            .unwrap();
        assert_eq!((p.dlid, alt), (Lid(5), None));
        // The primary's errors are the resolve's.
        let e = r
            .resolve_with_alternate(PathTarget::Lid(Lid(0x200)))
            .await
            .unwrap_err();
        assert!(matches!(e, PathError::Sa(SaError::Status { .. })), "{e:?}");
        // Paths outside the port's P_Key 0 are no alternate.
        let other = FakeSa {
            lmc: true,
            pkey: Some(Pkey(0x8001)),
            ..FakeSa::default()
        };
        let e = resolver(other, test_port(2))
            .resolve_with_alternate(PathTarget::Lid(Lid(5)))
            .await
            .unwrap_err();
        assert!(matches!(e, PathError::PkeyMismatch { .. }), "{e:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn every_failure_has_its_error() {
        // No records for LIDs the fake SA does not know (ERR_NO_RECORDS).
        let r = resolver(FakeSa::default(), test_port(2));
        let e = r.resolve(PathTarget::Lid(Lid(0x200))).await.unwrap_err();
        assert!(
            matches!(
                e,
                PathError::Sa(SaError::Status {
                    sa: SaStatus::NoRecords,
                    ..
                })
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains("NoRecords"), "{e}");
        // An SA that never answers: 1 + 3 attempts.
        let silent = FakeSa {
            drop: usize::MAX,
            ..FakeSa::default()
        };
        let e = resolver(silent, test_port(2))
            .resolve(PathTarget::Lid(Lid(5)))
            .await
            .unwrap_err();
        assert_eq!(e, PathError::Sa(SaError::Timeout { attempts: 4 }));
        // An OK answer without a record (a Get's is all zeros: DLID 0).
        let empty = FakeSa {
            empty: true,
            ..FakeSa::default()
        };
        let e = resolver(empty, test_port(2))
            .resolve(PathTarget::Lid(Lid(5)))
            .await
            .unwrap_err();
        assert_eq!(e, PathError::NoRecord);
        // A path in another partition.
        let other = FakeSa {
            pkey: Some(Pkey(0x8001)),
            ..FakeSa::default()
        };
        let e = resolver(other, test_port(2))
            .resolve(PathTarget::Lid(Lid(5)))
            .await
            .unwrap_err();
        assert_eq!(
            e,
            PathError::PkeyMismatch {
                pkey: 0x8001,
                pkey0: 0xffff
            }
        );
        // The limited member of the same partition is the same partition.
        let limited = FakeSa {
            pkey: Some(Pkey(0x7fff)),
            ..FakeSa::default()
        };
        assert!(resolver(limited, test_port(2))
            .resolve(PathTarget::Lid(Lid(5)))
            .await
            .is_ok());
        // A port the SM has not configured, and a RoCE port: nothing is sent.
        let mut port = test_port(2);
        port.sm_lid = Lid(0);
        let e = resolver(FakeSa::default(), port)
            .resolve(PathTarget::Lid(Lid(5)))
            .await
            .unwrap_err();
        assert_eq!(e, PathError::NoSm { lid: 2, sm_lid: 0 });
        let mut port = test_port(2);
        port.link_layer = LinkLayer::Ethernet;
        port.gid = Gid::from_ip("10.0.0.2".parse().unwrap());
        let e = resolver(FakeSa::default(), port)
            .resolve(PathTarget::Lid(Lid(5)))
            .await
            .unwrap_err();
        assert_eq!(e, PathError::NoSa);
    }
}
