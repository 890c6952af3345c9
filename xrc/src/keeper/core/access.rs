//! Who may do what: every domain and TGT QP has an owner uid (the client's, from
//! `SO_PEERCRED`); a client acts only on its own objects unless the object's sharing rule
//! allows it:
//!
//! * a **domain** is its opener's. Another uid may use it (create QPs in it, register on its
//!   Shared QPs, accept REQs into it) only if it is a file-named domain and that uid opened it
//!   under the same name **and the same path**, passing the path check below — the name alone
//!   is not a capability: a name held by another uid for another path (or a private domain)
//!   is refused with `permission-denied`, never handed out. Only the owner closes it;
//! * a **TGT QP** is its creator's uid. Another uid may register on it only if it is `Shared`
//!   and that uid may use its domain; modify and adopt follow the same rule; destroy stays the
//!   owning session's (the registry's rule). Registrations and connections are per session;
//! * a **path** (file-named domain): with the verbs backend the keeper opens the file, so it
//!   first checks that the client's uid/gid may open it itself — read permission on an
//!   existing file, write and search permission on the directory of a file to create — and
//!   gives a file it created to the client (`chown`), so no file is created as the keeper's
//!   user on a client's behalf. With the software backend paths are names in the model (no
//!   file is opened); a path that exists on disk is checked all the same when it is shared.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::keeper::proto::{ErrorBody, ErrorKind, Reply};
use crate::registry::DomainId;
use crate::types::{DomainSpec, Qpn};

use super::args::{err, registry_err};
use super::{KeeperCore, SessionId};

/// What one Unix user (by `SO_PEERCRED` uid, over all its sessions) may hold in a keeper; more
/// is refused with `quota-exceeded`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeeperLimits {
    /// Sessions open at once (each costs the keeper two threads).
    pub sessions_per_user: usize,
    /// Domains the user created.
    pub domains_per_user: usize,
    /// TGT QPs the user created (`create`, `create-or-register`, an `accept-req` that may
    /// create one).
    pub qps_per_user: usize,
}

impl Default for KeeperLimits {
    fn default() -> Self {
        KeeperLimits {
            sessions_per_user: 256,
            domains_per_user: 1024,
            qps_per_user: 16_384,
        }
    }
}

/// A client's credentials (from `SO_PEERCRED`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::keeper) struct Cred {
    /// Effective uid.
    pub uid: u32,
    /// Effective gid.
    pub gid: u32,
}

impl Cred {
    /// The keeper process's own credentials.
    pub(in crate::keeper) fn own() -> Self {
        Self {
            uid: rustix::process::geteuid().as_raw(),
            gid: rustix::process::getegid().as_raw(),
        }
    }
}

/// The owner and the admitted users of one domain.
#[derive(Clone, Debug, Default)]
pub(super) struct DomainAcl {
    pub owner: u32,
    pub users: BTreeSet<u32>,
}

/// Owners of the keeper's objects.
#[derive(Clone, Debug, Default)]
pub(super) struct Owners {
    pub domains: BTreeMap<DomainId, DomainAcl>,
    pub qps: BTreeMap<Qpn, u32>,
}

impl Owners {
    pub(super) fn may_use_domain(&self, id: DomainId, uid: u32) -> bool {
        self.domains
            .get(&id)
            .is_some_and(|a| a.owner == uid || a.users.contains(&uid))
    }

    pub(super) fn domain_owner(&self, id: DomainId) -> Option<u32> {
        self.domains.get(&id).map(|a| a.owner)
    }

    pub(super) fn qp_owner(&self, qpn: Qpn) -> Option<u32> {
        self.qps.get(&qpn).copied()
    }
}

pub(super) fn denied(message: String) -> ErrorBody {
    err(ErrorKind::PermissionDenied, message)
}

fn quota(message: String) -> ErrorBody {
    err(ErrorKind::QuotaExceeded, message)
}

/// Unix permission check of `mode`/`owner`/`group` for `who` (the bits a non-root process is
/// judged by; uid 0 passes).
fn allowed(meta: &std::fs::Metadata, who: Cred, want: u32) -> bool {
    if who.uid == 0 {
        return true;
    }
    let mode = meta.mode();
    let bits = if meta.uid() == who.uid {
        (mode >> 6) & 7
    } else if meta.gid() == who.gid {
        (mode >> 3) & 7
    } else {
        mode & 7
    };
    bits & want == want
}

const R: u32 = 4;
const W: u32 = 2;
const X: u32 = 1;

/// Returns whether the file is to be created. Whether `who` could open `path` itself: read permission on an existing file (the keeper
/// opens it read-write, else read-only), or, when it does not exist and `create` is asked, write and search on its
/// directory (and search on every directory above, as the kernel's lookup would need).
///
/// # Errors
/// A `permission-denied` body saying what is missing.
pub(super) fn check_path(path: &Path, who: Cred, create: bool) -> Result<bool, ErrorBody> {
    let no = |what: &str| {
        denied(format!(
            "uid {} may not {what} {} (the keeper opens domain files with the client's permissions)",
            who.uid,
            path.display()
        ))
    };
    // Every directory on the way must be searchable by the client.
    let mut dirs: Vec<&Path> = path.ancestors().skip(1).collect();
    dirs.reverse();
    for d in dirs.iter().filter(|d| !d.as_os_str().is_empty()) {
        if let Ok(m) = std::fs::metadata(d) {
            if !allowed(&m, who, X) {
                return Err(no("reach"));
            }
        }
    }
    match std::fs::metadata(path) {
        Ok(m) => {
            if !allowed(&m, who, R) {
                return Err(no("read"));
            }
            Ok(false)
        }
        Err(_) if create => {
            let parent = path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            match std::fs::metadata(parent) {
                Ok(m) if allowed(&m, who, W | X) => Ok(true),
                _ => Err(no("create")),
            }
        }
        Err(_) => Ok(false),
    }
}

/// Gives a file the keeper created for `who` to it.
pub(super) fn give(path: &Path, who: Cred) -> Result<(), ErrorBody> {
    std::os::unix::fs::chown(path, Some(who.uid), Some(who.gid)).map_err(|e| {
        err(
            ErrorKind::Internal,
            format!("chown {} to uid {}: {e}", path.display(), who.uid),
        )
    })
}

impl<K: super::KeeperConn> KeeperCore<K> {
    fn who(&self, s: SessionId) -> Result<Cred, ErrorBody> {
        self.cred(s)
            .ok_or_else(|| denied(format!("session {s} is not open")))
    }

    /// The domain `name`, if session `s` may use it (its owner, or a uid admitted by
    /// opening it under the same path).
    pub(in crate::keeper) fn usable_domain(
        &self,
        s: SessionId,
        name: &str,
    ) -> Result<DomainId, ErrorBody> {
        let id = self.domain_arg(name)?;
        let who = self.who(s)?;
        if self.owners.may_use_domain(id, who.uid) {
            return Ok(id);
        }
        Err(denied(format!(
            "domain {name:?} belongs to uid {}: uid {} may not use it (a file-named domain is \
             shared by opening it with its path)",
            self.owners
                .domain_owner(id)
                .map_or_else(|| "?".to_owned(), |u| u.to_string()),
            who.uid
        )))
    }

    /// The domain `name`, if session `s`'s uid owns it (to close it).
    pub(super) fn owned_domain(&self, s: SessionId, name: &str) -> Result<DomainId, ErrorBody> {
        let id = self.domain_arg(name)?;
        let who = self.who(s)?;
        match self.owners.domain_owner(id) {
            Some(o) if o == who.uid => Ok(id),
            o => Err(denied(format!(
                "domain {name:?} belongs to uid {}: only its owner may close it",
                o.map_or_else(|| "?".to_owned(), |u| u.to_string())
            ))),
        }
    }

    /// Whether session `s` may `what` the TGT QP `qpn`: its owner uid, or — when `shared_ok`
    /// — any uid that may use its domain if the QP is `Shared`. Unknown QPs pass (the
    /// registry answers `unknown-qpn`).
    pub(in crate::keeper) fn check_qp(
        &self,
        s: SessionId,
        qpn: Qpn,
        what: &str,
        shared_ok: bool,
    ) -> Result<(), ErrorBody> {
        let who = self.who(s)?;
        let Ok(q) = self.reg.query(qpn) else {
            return Ok(());
        };
        let owner = self.owners.qp_owner(qpn);
        if owner == Some(who.uid) {
            return Ok(());
        }
        if shared_ok
            && q.policy == crate::policy::OwnershipPolicy::Shared
            && self.owners.may_use_domain(q.domain, who.uid)
        {
            return Ok(());
        }
        Err(denied(format!(
            "TGT QP {qpn} belongs to uid {}: uid {} may not {what} it",
            owner.map_or_else(|| "?".to_owned(), |u| u.to_string()),
            who.uid
        )))
    }

    /// Sets what one user may hold.
    pub(in crate::keeper) fn set_limits(&mut self, l: KeeperLimits) {
        self.limits = l;
    }

    /// A `quota-exceeded` reply if `cred`'s user already has as many sessions as allowed.
    pub(in crate::keeper) fn session_quota(&self, cred: Cred) -> Option<Reply> {
        let n = self
            .sessions
            .values()
            .filter(|s| s.cred.uid == cred.uid)
            .count();
        (n >= self.limits.sessions_per_user).then(|| Reply {
            id: None,
            epoch: self.epoch.clone(),
            ok: false,
            result: None,
            error: Some(quota(format!(
                "uid {} has {n} sessions open, the most one user may have",
                cred.uid
            ))),
        })
    }

    /// `quota-exceeded` if session `s`'s user created as many TGT QPs as allowed.
    pub(super) fn qp_quota(&self, s: SessionId) -> Result<(), ErrorBody> {
        let who = self.who(s)?;
        // Live ones: a destroyed QP in its quarantine is given back.
        let live = |q: &Qpn| {
            self.reg
                .query(*q)
                .is_ok_and(|t| t.life == crate::registry::QpLife::Live)
        };
        let n = self
            .owners
            .qps
            .iter()
            .filter(|(q, u)| **u == who.uid && live(q))
            .count();
        if n >= self.limits.qps_per_user {
            return Err(quota(format!(
                "uid {} created {n} TGT QPs, the most one user may hold",
                who.uid
            )));
        }
        Ok(())
    }

    /// Records `qpn` as created by session `s`.
    pub(super) fn own_qp(&mut self, s: SessionId, qpn: Qpn) {
        if let Some(c) = self.cred(s) {
            self.owners.qps.insert(qpn, c.uid);
        }
    }

    /// `open-domain` for session `s` under the sharing rule (module docs).
    pub(super) fn open_domain_for(
        &mut self,
        s: SessionId,
        name: &str,
        path: Option<&str>,
        create: bool,
        exclusive: bool,
    ) -> Result<DomainId, ErrorBody> {
        let who = self.who(s)?;
        let spec = match path {
            None => DomainSpec::Private,
            Some(p) => DomainSpec::File {
                path: p.into(),
                create,
                exclusive,
            },
        };
        if let Some(id) = self.reg.domain_by_name(name) {
            let owner = self.owners.domain_owner(id);
            if owner != Some(who.uid) {
                let held = self
                    .reg
                    .domain(id)
                    .and_then(|d| d.spec.path().map(Path::to_owned));
                let same = matches!((&held, path), (Some(a), Some(b)) if a == Path::new(b));
                if !same {
                    return Err(denied(format!(
                        "domain name {name:?} is held by uid {} for {}: a domain name is not a \
                         capability, it is not handed to uid {} (use another name)",
                        owner.map_or_else(|| "?".to_owned(), |u| u.to_string()),
                        held.map_or_else(
                            || "a private domain".to_owned(),
                            |p| format!("path {}", p.display())
                        ),
                        who.uid
                    )));
                }
                if let Some(p) = path.map(Path::new).filter(|p| p.exists()) {
                    check_path(p, who, false)?;
                }
            }
            let id = self
                .reg
                .open_domain(name, spec)
                .map_err(|e| registry_err(&e))?;
            if let Some(a) = self.owners.domains.get_mut(&id) {
                a.users.insert(who.uid);
            }
            return Ok(id);
        }
        let mine = self
            .owners
            .domains
            .values()
            .filter(|a| a.owner == who.uid)
            .count();
        if mine >= self.limits.domains_per_user {
            return Err(quota(format!(
                "uid {} created {mine} domains, the most one user may hold",
                who.uid
            )));
        }
        let created = match path {
            Some(p) if self.backend == "verbs" => check_path(Path::new(p), who, create)?,
            _ => false,
        };
        let id = self
            .reg
            .open_domain(name, spec)
            .map_err(|e| registry_err(&e))?;
        if let (true, Some(p)) = (created, path) {
            if let Err(e) = give(Path::new(p), who) {
                self.log.push(e.message);
            }
        }
        self.owners.domains.insert(
            id,
            DomainAcl {
                owner: who.uid,
                users: BTreeSet::new(),
            },
        );
        Ok(id)
    }
}
