//! XRC: the target services the daemon hosts (ibcm_xrc_listen, …), and the OFED
//! persistent-server operations on the node's one registry of TGT QPs: named XRC domains
//! shared by file (ibcm_xrcd_open), TGT QPs created, registered on, queried and modified by
//! number from any process the keeper's rules admit (docs/xrc.md §8), whatever process created
//! them.

use std::ffi::{c_char, c_int};

use serde_json::{json, Value};

use super::ctx::ibcm_ctx;
use super::types::ibcm_status::*;
use super::types::{
    ibcm_qp_attr, ibcm_xrc_tgt_info, IBCM_XRCD_CREATE, IBCM_XRCD_EXCL, IBCM_XRCD_NAME_MAX,
    IBCM_XRC_SRQNS_MAX,
};
use super::{bytes, context, guard, put, string};
use crate::error::{Error, Result};

/// The node protocol's name of an `ibcm_xrc_policy` (`xrc-listen`), and the keeper's.
fn policy_names(policy: c_int) -> Result<(&'static str, &'static str)> {
    Ok(match policy {
        0 => ("explicit", "explicit"),
        1 => ("domain", "domain-bound"),
        2 => ("process", "process-bound"),
        3 => ("shared", "shared"),
        p => return Err(Error::new(IBCM_EINVAL, format!("XRC policy {p} (0..3)"))),
    })
}

/// The SRQ numbers of an XRC listen.
///
/// # Safety
/// `srqns` is NULL or readable for `n_srqns` numbers.
unsafe fn srqns_arg(srqns: *const u32, n_srqns: u32) -> Result<Vec<u32>> {
    if n_srqns == 0 || srqns.is_null() {
        return Err(Error::new(IBCM_EINVAL, "an XRC service needs SRQ numbers"));
    }
    if n_srqns > IBCM_XRC_SRQNS_MAX {
        return Err(Error::new(
            IBCM_EINVAL,
            format!("{n_srqns} SRQ numbers: a REP announces {IBCM_XRC_SRQNS_MAX} at most"),
        ));
    }
    let len = n_srqns.saturating_mul(4);
    // SAFETY: readable for `n_srqns` numbers, the caller's contract.
    let raw = unsafe { bytes(srqns.cast::<u8>(), len, "srqns") }?;
    Ok(raw
        .chunks_exact(4)
        .filter_map(|b| <[u8; 4]>::try_from(b).ok())
        .map(u32::from_ne_bytes)
        .collect())
}

/// A domain name: not NULL, 1..=`IBCM_XRCD_NAME_MAX` bytes.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
pub(super) unsafe fn domain_arg(p: *const c_char, what: &str) -> Result<String> {
    // SAFETY: the caller's contract.
    let s = unsafe { string(p, what) }?;
    if s.is_empty() || s.len() > IBCM_XRCD_NAME_MAX as usize {
        return Err(Error::new(
            IBCM_EINVAL,
            format!("{what}: a domain name is 1 to {IBCM_XRCD_NAME_MAX} bytes"),
        ));
    }
    Ok(s)
}

/// Has the daemon answer the XRC REQs for `service_id` as an XRC target owned by this
/// context: the TGT QPs it creates get `policy` (an `ibcm_xrc_policy`) and this context as
/// their creating process, and the REPs announce the `n_srqns` SRQ numbers `srqns`
/// (1..=`IBCM_XRC_SRQNS_MAX`, else `IBCM_EINVAL`). Reports come as `IBCM_EVENT_XRC_REPORT`.
/// `IBCM_EREFUSED`: the service is another client's, an SRQ number is out of range, a quota;
/// `IBCM_EUNSUPPORTED`: the daemon's device has no XRC (its reason in the text).
///
/// # Safety
/// `ctx` is NULL or a live context; `srqns` is NULL or readable for `n_srqns` numbers.
#[no_mangle]
pub unsafe extern "C" fn ibcm_xrc_listen(
    ctx: *mut ibcm_ctx,
    service_id: u64,
    policy: c_int,
    srqns: *const u32,
    n_srqns: u32,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { context(ctx) }?;
        let (policy, _) = policy_names(policy)?;
        // SAFETY: the caller's contract.
        let srqns = unsafe { srqns_arg(srqns, n_srqns) }?;
        c.xrc_listen(service_id, policy, &srqns)
    })
}

/// Stops serving `service_id` as an XRC target (its TGT QPs stay, per their policy).
/// `IBCM_ENOENT` when this context does not serve it.
///
/// # Safety
/// `ctx` is NULL or a live context.
#[no_mangle]
pub unsafe extern "C" fn ibcm_xrc_unlisten(ctx: *mut ibcm_ctx, service_id: u64) -> c_int {
    // SAFETY: the caller's contract.
    guard(|| unsafe { context(ctx) }?.xrc_unlisten(service_id))
}

/// Destroys every TGT QP this context owns, as their owner: their initiators get a DREQ
/// with "target gone (owner destroyed it)". `*destroyed` (if not NULL) says how many. QPs of
/// the shared policy (`IBCM_XRC_SHARED`) have no owner: they live until their last
/// connection ends, and are neither destroyed nor counted here.
///
/// # Safety
/// `ctx` is NULL or a live context; `destroyed` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ibcm_xrc_destroy(ctx: *mut ibcm_ctx, destroyed: *mut u64) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let n = unsafe { context(ctx) }?.xrc_destroy()?;
        if destroyed.is_null() {
            return Ok(());
        }
        // SAFETY: non-null and writable by the caller's contract.
        unsafe { put(destroyed, n, "destroyed") }
    })
}

/// As ibcm_xrc_listen, in XRC domain `domain` (one this context opened with ibcm_xrcd_open):
/// the TGT QPs it creates are that domain's. With `tgt_qpn` not 0, every REQ is answered
/// with that TGT QP (one this context created or may register on: a runtime's persistent
/// server QP), which its connections do not hold (the processes registered on it do).
/// `IBCM_EREFUSED`: as ibcm_xrc_listen, a domain this context did not open, a QP it may not use.
///
/// # Safety
/// `ctx` is NULL or a live context; `srqns` is NULL or readable for `n_srqns` numbers;
/// `domain` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn ibcm_xrc_listen_domain(
    ctx: *mut ibcm_ctx,
    service_id: u64,
    policy: c_int,
    srqns: *const u32,
    n_srqns: u32,
    domain: *const c_char,
    tgt_qpn: u32,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { context(ctx) }?;
        let (policy, _) = policy_names(policy)?;
        // SAFETY: the caller's contract.
        let srqns = unsafe { srqns_arg(srqns, n_srqns) }?;
        // SAFETY: the caller's contract.
        let domain = unsafe { domain_arg(domain, "domain") }?;
        let tgt = (tgt_qpn != 0).then_some(tgt_qpn);
        c.xrc_listen_in(service_id, policy, &srqns, &domain, tgt)
    })
}

/// Opens (with `IBCM_XRCD_CREATE`, creates) the XRC domain named by the file `path` in the
/// daemon, under the name `name` for this context's later calls — OFED's `ibv_open_xrcd` with
/// an fd: every process that opens the same file holds the same domain (the daemon keys it by
/// the file, as the kernel keys it by inode). `path` NULL: a private domain of this context.
/// `IBCM_XRCD_EXCL` with `IBCM_XRCD_CREATE` fails if the file names a domain already. Closing the
/// context closes its domains. Errors: `IBCM_EINVAL`, `IBCM_ENOENT` (no domain there and no
/// `IBCM_XRCD_CREATE`), `IBCM_EREFUSED` (the name is taken, another user's domain, a quota),
/// `IBCM_EUNSUPPORTED` (the daemon's device has no XRC; the text says the verbs error).
///
/// # Safety
/// `ctx` is NULL or a live context; `name` and `path` are NULL or NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn ibcm_xrcd_open(
    ctx: *mut ibcm_ctx,
    name: *const c_char,
    path: *const c_char,
    flags: u32,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { context(ctx) }?;
        let known = IBCM_XRCD_CREATE | IBCM_XRCD_EXCL;
        if flags & !known != 0 {
            return Err(Error::new(
                IBCM_EINVAL,
                format!("unknown flags {:#x}", flags & !known),
            ));
        }
        // SAFETY: the caller's contract.
        let name = unsafe { domain_arg(name, "name") }?;
        let path = if path.is_null() {
            Value::Null
        } else {
            // SAFETY: the caller's contract.
            Value::String(unsafe { domain_arg(path, "path") }?)
        };
        c.keeper(json!({
            "op": "open-domain",
            "domain": name,
            "path": path,
            "create": flags & IBCM_XRCD_CREATE != 0,
            "exclusive": flags & IBCM_XRCD_EXCL != 0,
        }))
        .map(drop)
    })
}

/// Closes this context's domain `name`: the QPs in it end per their policy (docs/xrc.md §8.2:
/// domain-bound, process-bound and shared QPs are released; an explicit one keeps the domain
/// open until it is destroyed).
///
/// # Safety
/// `ctx` is NULL or a live context; `name` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn ibcm_xrcd_close(ctx: *mut ibcm_ctx, name: *const c_char) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { context(ctx) }?;
        // SAFETY: the caller's contract.
        let name = unsafe { domain_arg(name, "name") }?;
        c.keeper(json!({ "op": "close-domain", "domain": name }))
            .map(drop)
    })
}

/// Creates a TGT QP in domain `domain` (this context's) with `policy` (`ibcm_xrc_policy`);
/// this context is its creator (and owner, but for `IBCM_XRC_SHARED`: registered). Its number
/// goes to `*qpn`. Errors: `IBCM_EINVAL`, `IBCM_ENOENT` (no such domain), `IBCM_EREFUSED`
/// (the quota of TGT QPs), `IBCM_EUNSUPPORTED` (no XRC).
///
/// # Safety
/// `ctx` is NULL or a live context; `domain` is NULL or a NUL-terminated string; `qpn` is NULL
/// or writable.
#[no_mangle]
pub unsafe extern "C" fn ibcm_xrc_tgt_create(
    ctx: *mut ibcm_ctx,
    domain: *const c_char,
    policy: c_int,
    qpn: *mut u32,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { context(ctx) }?;
        // SAFETY: the caller's contract.
        let domain = unsafe { domain_arg(domain, "domain") }?;
        let (_, policy) = policy_names(policy)?;
        if qpn.is_null() {
            return Err(Error::new(IBCM_EINVAL, "qpn is NULL"));
        }
        let r = c.keeper(json!({ "op": "create", "domain": domain, "policy": policy }))?;
        let n = qpn_of(&r)?;
        // SAFETY: non-null and writable by the caller's contract.
        unsafe { put(qpn, n, "qpn") }
    })
}

fn qpn_of(r: &Value) -> Result<u32> {
    r.get("qpn")
        .and_then(Value::as_u64)
        .and_then(|q| u32::try_from(q).ok())
        .ok_or_else(|| Error::new(IBCM_EIO, format!("the keeper's reply names no QP: {r}")))
}

/// One keeper operation on TGT QP `qpn`.
fn on_qp(ctx: *mut ibcm_ctx, op: &str, qpn: u32) -> c_int {
    guard(|| {
        // SAFETY: the exported functions' contract: NULL or a live context.
        let c = unsafe { context(ctx) }?;
        c.keeper(json!({ "op": op, "qpn": qpn })).map(drop)
    })
}

/// Registers this context on TGT QP `qpn` (OFED `ibv_reg_xrc_rcv_qp`): any process the
/// keeper's rules admit (its creator's uid, or a domain it may use), not only its creator.
/// A shared QP lives while a registration holds it; on the others a registration is a
/// non-owning use, told when the QP goes (`IBCM_EVENT_XRC_REPORT`, `IBCM_XRC_QP_GONE`). Ended
/// by ibcm_xrc_tgt_unregister or the context's end. Errors: `IBCM_ENOENT` (no such QP),
/// `IBCM_ECLOSED` (gone), `IBCM_EREFUSED` (another user's).
///
/// # Safety
/// `ctx` is NULL or a live context.
#[no_mangle]
pub unsafe extern "C" fn ibcm_xrc_tgt_register(ctx: *mut ibcm_ctx, qpn: u32) -> c_int {
    on_qp(ctx, "register", qpn)
}

/// Drops one registration of this context on TGT QP `qpn` (OFED `ibv_unreg_xrc_rcv_qp`); a
/// shared QP whose last registration this was is released. `IBCM_ENOENT` when this context
/// holds none.
///
/// # Safety
/// `ctx` is NULL or a live context.
#[no_mangle]
pub unsafe extern "C" fn ibcm_xrc_tgt_unregister(ctx: *mut ibcm_ctx, qpn: u32) -> c_int {
    on_qp(ctx, "unregister", qpn)
}

/// Destroys TGT QP `qpn` as its owner (an orphan: as any client of its owner's uid); its
/// connections get a DREQ saying "target gone (owner destroyed it)". `IBCM_EREFUSED` when this
/// context is not its owner.
///
/// # Safety
/// `ctx` is NULL or a live context.
#[no_mangle]
pub unsafe extern "C" fn ibcm_xrc_tgt_destroy(ctx: *mut ibcm_ctx, qpn: u32) -> c_int {
    on_qp(ctx, "destroy", qpn)
}

/// Queries TGT QP `qpn` (OFED `ibv_query_xrc_rcv_qp`, from any process, its creator or not):
/// policy, state, creator and owner, registrations, connections; a gone QP is reported with
/// `live` 0 and why (until its number is reused). `IBCM_ENOENT`: no such QP.
///
/// # Safety
/// `ctx` is NULL or a live context; `info` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ibcm_xrc_tgt_query(
    ctx: *mut ibcm_ctx,
    qpn: u32,
    info: *mut ibcm_xrc_tgt_info,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { context(ctx) }?;
        if info.is_null() {
            return Err(Error::new(IBCM_EINVAL, "info is NULL"));
        }
        let v = c.keeper(json!({ "op": "query", "qpn": qpn }))?;
        let i = tgt_info(&v)?;
        // SAFETY: non-null and writable by the caller's contract.
        unsafe { put(info, i, "info") }
    })
}

/// The keeper's QP view as the C struct.
fn tgt_info(v: &Value) -> Result<ibcm_xrc_tgt_info> {
    let num = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    let u32_of = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    let policy = match v.get("policy").and_then(Value::as_str) {
        Some("explicit") => 0,
        Some("domain-bound") => 1,
        Some("process-bound") => 2,
        Some("shared") => 3,
        p => return Err(Error::new(IBCM_EIO, format!("unknown policy {p:?} in {v}"))),
    };
    let state = match v.get("state").and_then(Value::as_str).unwrap_or("") {
        "RESET" => 0,
        "INIT" => 1,
        "RTR" => 2,
        "RTS" => 3,
        "SQD" => 4,
        "SQE" => 5,
        _ => 6,
    };
    let life = v.get("life").and_then(Value::as_str).unwrap_or("");
    let registrations = v.get("holders").and_then(Value::as_array).map_or(0, |hs| {
        hs.iter()
            .map(|h| h.get("count").and_then(Value::as_u64).unwrap_or(1))
            .sum::<u64>()
    });
    let conns = v.get("conns").and_then(Value::as_array).map_or(0, Vec::len);
    let mut reason = [0 as c_char; 128];
    let why = life.strip_prefix("gone: ").unwrap_or("");
    for (d, s) in reason.iter_mut().zip(why.bytes().take(127)) {
        *d = s as c_char;
    }
    Ok(ibcm_xrc_tgt_info {
        qpn: u32_of(num("qpn")),
        policy,
        live: u8::from(life == "live"),
        qp_state: state,
        creator_pid: u32_of(num("creator_pid")),
        owner_pid: u32_of(num("owner_pid")),
        registrations: u32_of(registrations),
        connections: u32::try_from(conns).unwrap_or(u32::MAX),
        reason,
    })
}

/// Modifies TGT QP `qpn` (OFED `ibv_modify_xrc_rcv_qp`, from any process its rules admit, its
/// creator or not) with the fields of `attr` named by `mask` (`enum ibv_qp_attr_mask` bits,
/// as ibcm_init_qp_attr gives them): state, P_Key index, port, access flags, path MTU,
/// destination QPN, RQ and SQ PSNs, timeout, minimum RNR timer, max destination RDMA reads,
/// the address vector. `IBCM_EINVAL`: a transition or attribute the QP refuses (the text says
/// which), a mask bit not listed.
///
/// # Safety
/// `ctx` is NULL or a live context; `attr` is NULL or readable.
#[no_mangle]
pub unsafe extern "C" fn ibcm_xrc_tgt_modify(
    ctx: *mut ibcm_ctx,
    qpn: u32,
    attr: *const ibcm_qp_attr,
    mask: c_int,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { context(ctx) }?;
        // SAFETY: the caller's contract.
        let a =
            unsafe { super::opt(attr) }.ok_or_else(|| Error::new(IBCM_EINVAL, "attr is NULL"))?;
        let m = modify_json(a, mask)?;
        c.keeper(json!({ "op": "modify", "qpn": qpn, "attr": m }))
            .map(drop)
    })
}

/// `enum ibv_qp_attr_mask` bits ibcm_xrc_tgt_modify takes.
const STATE: c_int = 1 << 0;
const CUR_STATE: c_int = 1 << 1;
const ACCESS_FLAGS: c_int = 1 << 3;
const PKEY_INDEX: c_int = 1 << 4;
const PORT: c_int = 1 << 5;
const AV: c_int = 1 << 7;
const PATH_MTU: c_int = 1 << 8;
const TIMEOUT: c_int = 1 << 9;
const RQ_PSN: c_int = 1 << 12;
const MIN_RNR_TIMER: c_int = 1 << 15;
const SQ_PSN: c_int = 1 << 16;
const MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
const DEST_QPN: c_int = 1 << 20;

/// The keeper's `modify` attributes from the C struct and mask.
fn modify_json(a: &ibcm_qp_attr, mask: c_int) -> Result<Value> {
    let known = STATE
        | CUR_STATE
        | ACCESS_FLAGS
        | PKEY_INDEX
        | PORT
        | AV
        | PATH_MTU
        | TIMEOUT
        | RQ_PSN
        | MIN_RNR_TIMER
        | SQ_PSN
        | MAX_DEST_RD_ATOMIC
        | DEST_QPN;
    if mask & !known != 0 {
        return Err(Error::new(
            IBCM_EINVAL,
            format!("mask bits {:#x} are not modifiable here", mask & !known),
        ));
    }
    let state = |s: u32| -> Result<&'static str> {
        Ok(match s {
            0 => "RESET",
            1 => "INIT",
            2 => "RTR",
            3 => "RTS",
            4 => "SQD",
            5 => "SQE",
            6 => "ERR",
            s => return Err(Error::new(IBCM_EINVAL, format!("QP state {s} (0..6)"))),
        })
    };
    let mut m = serde_json::Map::new();
    let mut put = |k: &str, v: Value| {
        m.insert(k.to_owned(), v);
    };
    if mask & STATE != 0 {
        put("state", json!(state(a.qp_state)?));
    }
    if mask & CUR_STATE != 0 {
        put("cur_state", json!(state(a.qp_state)?));
    }
    if mask & ACCESS_FLAGS != 0 {
        put("access_flags", json!(a.qp_access_flags));
    }
    if mask & PKEY_INDEX != 0 {
        put("pkey_index", json!(a.pkey_index));
    }
    if mask & PORT != 0 {
        put("port", json!(a.port_num));
    }
    if mask & PATH_MTU != 0 {
        put("path_mtu", json!(a.path_mtu));
    }
    if mask & DEST_QPN != 0 {
        put("dest_qpn", json!(a.dest_qp_num));
    }
    if mask & RQ_PSN != 0 {
        put("rq_psn", json!(a.rq_psn));
    }
    if mask & SQ_PSN != 0 {
        put("sq_psn", json!(a.sq_psn));
    }
    if mask & TIMEOUT != 0 {
        put("timeout", json!(a.timeout));
    }
    if mask & MIN_RNR_TIMER != 0 {
        put("min_rnr_timer", json!(a.min_rnr_timer));
    }
    if mask & MAX_DEST_RD_ATOMIC != 0 {
        put("max_dest_rd_atomic", json!(a.max_dest_rd_atomic));
    }
    if mask & AV != 0 {
        let h = &a.ah_attr;
        let dgid = (h.is_global != 0).then(|| {
            h.grh
                .dgid
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        });
        put(
            "av",
            json!({
                "dlid": h.dlid, "sl": h.sl, "port": h.port_num, "static_rate": h.static_rate,
                "dgid": dgid, "sgid_index": h.grh.sgid_index, "hop_limit": h.grh.hop_limit,
                "traffic_class": h.grh.traffic_class, "flow_label": h.grh.flow_label,
            }),
        );
    }
    Ok(Value::Object(m))
}
