//! The keeper daemon: a Unix-socket server around `KeeperCore`, one reader thread and one
//! writer thread per client.
//!
//! A client's identity is its connection: the keeper reads the peer PID, uid and gid with
//! `SO_PEERCRED` when it accepts (the `hello` PID is used only if that fails; a client whose
//! credentials cannot be read is refused), and when the socket closes — clean exit, crash,
//! SIGKILL — `KeeperCore::close_session` releases exactly the references that connection
//! took. The uid owns what the session creates (`core::access`).
//!
//! Replies and events are never written under the keeper's lock: each client has a bounded
//! queue ([`OUT_QUEUE`] lines) drained by its own writer thread. A client that does not read
//! fills only its own queue; the keeper then cuts it off (its session closes as on a crash)
//! instead of waiting for it, so it never holds up the other clients.

use std::collections::BTreeMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use super::core::KeeperLimits;
use super::core::{Cred, KeeperCore, SessionId, Target};
use super::proto::{Envelope, EventLine, KeeperEvent, Reply};
use crate::registry::RegistryConfig;
use crate::verbs::model::{KernelModel, ModelConfig};
use crate::verbs::{Verbs, VerbsError};

/// Longest request line accepted.
pub(crate) const MAX_LINE: usize = 64 * 1024;

/// Stack of the per-client threads (thousands of clients are two threads each).
const THREAD_STACK: usize = 256 * 1024;

/// Lines (replies and events) queued for one client before the keeper gives up on it.
pub const OUT_QUEUE: usize = 1024;

/// Which verbs backend the keeper uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The software model (machines without an XRC device).
    Model(ModelConfig),
    /// rdma-core (feature `rdma`), on the named device or the first one.
    Verbs {
        /// Device name.
        device: Option<String>,
    },
}

/// Keeper settings.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The socket path.
    pub socket: PathBuf,
    /// The backend.
    pub backend: Backend,
    /// Registry settings.
    pub registry: RegistryConfig,
    /// What one user may hold.
    pub limits: KeeperLimits,
}

/// Errors starting or running the keeper.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// Another keeper answers on the socket.
    #[error("a keeper is already serving {0}")]
    AlreadyRunning(PathBuf),
    /// The socket path names something that is not a socket (a regular file, a directory…):
    /// the keeper never deletes it.
    #[error("{0} exists and is not a socket: refusing to replace it")]
    NotASocket(PathBuf),
    /// The backend could not be opened (e.g. "device has no XRC").
    #[error("backend: {0}")]
    Backend(VerbsError),
    /// Socket I/O.
    #[error("socket {path}: {source}")]
    Io {
        /// The socket path.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

impl From<VerbsError> for ServeError {
    fn from(e: VerbsError) -> Self {
        Self::Backend(e)
    }
}

/// A fresh epoch: differs between keeper instances (OS-seeded hash of PID and wall time).
pub(crate) fn new_epoch() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    format!("{:016x}", h.finish())
}

/// Opens the backend.
///
/// # Errors
/// [`VerbsError`], e.g. [`VerbsError::NoXrc`] or [`VerbsError::Unavailable`] when built without
/// the `rdma` feature.
pub(crate) fn open_backend(b: &Backend) -> Result<Box<dyn Verbs>, VerbsError> {
    match b {
        Backend::Model(cfg) => {
            let kernel = KernelModel::new(cfg.clone());
            Ok(Box::new(kernel.spawn()))
        }
        #[cfg(feature = "rdma")]
        Backend::Verbs { device } => {
            Ok(Box::new(crate::verbs::RdmaVerbs::open(device.as_deref())?))
        }
        #[cfg(not(feature = "rdma"))]
        Backend::Verbs { .. } => Err(VerbsError::Unavailable(
            "built without the `rdma` feature; rebuild with --features rdma".into(),
        )),
    }
}

/// One client's outbound side: its queue and its socket (to cut it off).
struct Writer {
    tx: SyncSender<String>,
    stream: UnixStream,
}

struct Shared {
    core: KeeperCore,
    writers: BTreeMap<SessionId, Writer>,
}

type SharedRef = Arc<Mutex<Shared>>;

fn lock(s: &SharedRef) -> MutexGuard<'_, Shared> {
    s.lock().unwrap_or_else(PoisonError::into_inner)
}

fn write_line(w: &mut UnixStream, line: &str) -> io::Result<()> {
    w.write_all(line.as_bytes())?;
    w.write_all(b"\n")
}

/// A client's writer thread: writes its queued lines, without the keeper's lock.
fn writer_loop(mut stream: UnixStream, rx: Receiver<String>) {
    for line in rx {
        if write_line(&mut stream, &line).is_err() {
            let _ = stream.shutdown(std::net::Shutdown::Both);
            return;
        }
    }
}

impl Writer {
    /// Queues a line; a full queue (the client does not read) or a gone writer cuts the
    /// client off: its reader sees EOF and closes the session.
    fn push(&self, line: String) {
        match self.tx.try_send(line) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                let _ = self.stream.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

impl Shared {
    fn deliver(&mut self, events: Vec<(Target, KeeperEvent)>) {
        let epoch = self.core.epoch().to_owned();
        for (target, event) in events {
            let Ok(line) = serde_json::to_string(&EventLine {
                epoch: epoch.clone(),
                event,
            }) else {
                continue;
            };
            let ids: Vec<SessionId> = match target {
                Target::All => self.writers.keys().copied().collect(),
                Target::Session(s) => vec![s],
            };
            for s in ids {
                if let Some(w) = self.writers.get(&s) {
                    w.push(line.clone());
                }
            }
        }
    }

    /// Takes the log lines, to print once the lock is released.
    fn take_log(&mut self) -> Vec<String> {
        self.core.take_log()
    }
}

fn print_log(lines: Vec<String>) {
    for l in lines {
        eprintln!("xrcd-keeper: {l}");
    }
}

/// The peer's PID, uid and gid (`SO_PEERCRED`).
fn peer_cred(s: &UnixStream) -> Option<(Option<u32>, Cred)> {
    let c = rustix::net::sockopt::socket_peercred(s).ok()?;
    let pid = u32::try_from(c.pid.as_raw_nonzero().get()).ok();
    Some((
        pid,
        Cred {
            uid: c.uid.as_raw(),
            gid: c.gid.as_raw(),
        },
    ))
}

fn client_loop(shared: &SharedRef, session: SessionId, stream: UnixStream) {
    let mut reader = BufReader::new(stream);
    let mut buf = String::new();
    loop {
        buf.clear();
        let n = match reader
            .by_ref()
            .take((MAX_LINE + 1) as u64)
            .read_line(&mut buf)
        {
            Ok(n) => n,
            Err(_) => break,
        };
        if n == 0 {
            break;
        }
        let line = buf.trim();
        if line.is_empty() {
            continue;
        }
        let mut sh = lock(shared);
        let reply: Reply = if buf.len() > MAX_LINE {
            let r = sh
                .core
                .bad_line(format!("line longer than {MAX_LINE} bytes"));
            send_reply(&sh, session, &r);
            break;
        } else {
            match serde_json::from_str::<Envelope>(line) {
                Ok(env) => {
                    let (r, events) = sh.core.handle(Instant::now(), session, env.id, env.req);
                    sh.deliver(events);
                    r
                }
                Err(e) => sh.core.bad_line(format!("bad request: {e}")),
            }
        };
        send_reply(&sh, session, &reply);
        let log = sh.take_log();
        drop(sh);
        print_log(log);
    }
    let mut sh = lock(shared);
    sh.writers.remove(&session);
    let events = sh.core.close_session(Instant::now(), session);
    sh.deliver(events);
    let log = sh.take_log();
    drop(sh);
    print_log(log);
}

fn send_reply(sh: &Shared, session: SessionId, reply: &Reply) {
    if let (Some(w), Ok(line)) = (sh.writers.get(&session), serde_json::to_string(reply)) {
        w.push(line);
    }
}

fn timer_loop(shared: &SharedRef) {
    loop {
        let (wait, log) = {
            let mut sh = lock(shared);
            let now = Instant::now();
            let events = sh.core.tick(now);
            sh.deliver(events);
            let wait = sh
                .core
                .next_deadline()
                .map_or(Duration::from_millis(500), |d| {
                    d.saturating_duration_since(now)
                });
            (wait, sh.take_log())
        };
        print_log(log);
        thread::sleep(wait.clamp(Duration::from_millis(10), Duration::from_millis(500)));
    }
}

/// Makes room for the socket: a live keeper's socket is left alone (error), a stale socket
/// is removed, anything else that is not a socket is refused and left in place.
fn prepare_socket(path: &Path) -> Result<(), ServeError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(ServeError::Io {
                path: path.to_owned(),
                source,
            })
        }
    };
    if !meta.file_type().is_socket() {
        return Err(ServeError::NotASocket(path.to_owned()));
    }
    if UnixStream::connect(path).is_ok() {
        return Err(ServeError::AlreadyRunning(path.to_owned()));
    }
    // A stale socket from a dead keeper.
    std::fs::remove_file(path).map_err(|source| ServeError::Io {
        path: path.to_owned(),
        source,
    })
}

/// Runs the keeper until the process is killed. Prints one `ready` line on standard output
/// once the socket accepts connections: `ready epoch=<hex> socket=<path> backend=<b>
/// device=<name>`.
///
/// # Errors
/// [`ServeError`] if the socket or the backend cannot be set up.
pub fn serve(cfg: &ServerConfig) -> Result<(), ServeError> {
    prepare_socket(&cfg.socket)?;
    let verbs = open_backend(&cfg.backend)?;
    let backend = match cfg.backend {
        Backend::Model(_) => "sim",
        Backend::Verbs { .. } => "verbs",
    };
    let device = verbs.device().name;
    let epoch = new_epoch();
    let mut core = KeeperCore::new(verbs, cfg.registry, epoch.clone(), backend, Instant::now());
    core.set_limits(cfg.limits);
    let listener = UnixListener::bind(&cfg.socket).map_err(|source| ServeError::Io {
        path: cfg.socket.clone(),
        source,
    })?;
    let shared: SharedRef = Arc::new(Mutex::new(Shared {
        core,
        writers: BTreeMap::new(),
    }));
    {
        let s = Arc::clone(&shared);
        thread::spawn(move || timer_loop(&s));
    }
    println!(
        "ready epoch={epoch} socket={} backend={backend} device={device}",
        cfg.socket.display()
    );
    let _ = io::stdout().flush();
    eprintln!(
        "xrcd-keeper: serving {} (epoch {epoch}, {backend} backend, device {device})",
        cfg.socket.display()
    );
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        let (Ok(out), Ok(cut)) = (stream.try_clone(), stream.try_clone()) else {
            continue;
        };
        let Some((pid, cred)) = peer_cred(&stream) else {
            eprintln!("xrcd-keeper: refusing a client whose credentials cannot be read");
            continue;
        };
        let refused = lock(&shared).core.session_quota(cred);
        if let Some(reply) = refused {
            // Told why, then closed: one user cannot exhaust the keeper's threads.
            eprintln!(
                "xrcd-keeper: uid {} refused: {}",
                cred.uid,
                quota_text(&reply)
            );
            let mut w = &stream;
            if let Ok(line) = serde_json::to_string(&reply) {
                let _ = writeln!(w, "{line}");
            }
            continue;
        }
        let (tx, rx) = sync_channel(OUT_QUEUE);
        let session = {
            let mut sh = lock(&shared);
            let s = sh.core.open_session_as(pid, cred);
            sh.writers.insert(s, Writer { tx, stream: cut });
            s
        };
        let spawned = thread::Builder::new()
            .name(format!("keeper-w{session}"))
            .stack_size(THREAD_STACK)
            .spawn(move || writer_loop(out, rx));
        let s = Arc::clone(&shared);
        let reader = spawned.and_then(|_| {
            thread::Builder::new()
                .name(format!("keeper-r{session}"))
                .stack_size(THREAD_STACK)
                .spawn(move || client_loop(&s, session, stream))
        });
        if let Err(e) = reader {
            eprintln!("xrcd-keeper: cannot start threads for session {session}: {e}");
            let mut sh = lock(&shared);
            if let Some(w) = sh.writers.remove(&session) {
                let _ = w.stream.shutdown(std::net::Shutdown::Both);
            }
            let events = sh.core.close_session(Instant::now(), session);
            sh.deliver(events);
        }
    }
    Ok(())
}

fn quota_text(r: &super::proto::Reply) -> String {
    r.error
        .as_ref()
        .map_or_else(String::new, |e| e.message.clone())
}
