//! A blocking keeper client (what `xrcd-keeper status|leaks|hold` use).
//!
//! The client remembers the keeper's epoch from `hello`. Every reply and event carries the
//! epoch again; after the keeper went away, [`KeeperClient::reconnect`] reports a different
//! epoch as [`ClientError::KeeperRestarted`] — "all keeper-held QPs are gone", because the
//! kernel dropped the dead keeper's handles — and never reconnects silently.
//!
//! Before it says anything the client checks who serves the socket: the daemon's uid
//! (`SO_PEERCRED`) and the socket file's owner must be root or the client's own effective
//! uid, else [`ClientError::UntrustedDaemon`] — an impostor socket planted in a shared
//! directory by another user is not talked to. Replies may be long (a `status` of thousands of
//! sessions): up to [`MAX_REPLY_LINE`] bytes.

use std::collections::VecDeque;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

use std::os::unix::fs::MetadataExt;

use super::proto::{Envelope, ErrorKind, EventLine, Reply, Request};

/// Longest reply or event line a client accepts (a `status` reply grows with the sessions,
/// domains and QPs: 3,000 sessions are ≈ 150 kB).
pub const MAX_REPLY_LINE: usize = 64 * 1024 * 1024;

/// Client errors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// Socket I/O.
    #[error("keeper socket: {0}")]
    Io(#[from] io::Error),
    /// The keeper closed the connection (it died or was stopped): every QP it held is gone.
    #[error("the keeper went away: all keeper-held QPs are gone")]
    KeeperGone,
    /// A different keeper instance answers: the old one died, and every QP it held is gone.
    #[error("the keeper restarted (epoch {old} -> {new}): all keeper-held QPs are gone")]
    KeeperRestarted {
        /// The epoch this client knew.
        old: String,
        /// The new keeper's epoch.
        new: String,
    },
    /// The keeper refused the request.
    #[error("{kind}: {message}")]
    Keeper {
        /// Error kind (the reply's `error.kind`).
        kind: ErrorKind,
        /// Text.
        message: String,
    },
    /// The keeper sent something this client does not understand.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The socket is served (or owned) by a user that is neither root nor this client's
    /// user: not a keeper this client trusts.
    #[error(
        "{path}: served by uid {uid}, which is neither root nor this user (uid {me}): not trusted"
    )]
    UntrustedDaemon {
        /// The socket.
        path: PathBuf,
        /// The daemon's uid (or the socket file's owner).
        uid: u32,
        /// This client's effective uid.
        me: u32,
    },
}

impl ClientError {
    /// The keeper's error kind, for [`ClientError::Keeper`].
    pub fn keeper_kind(&self) -> Option<&ErrorKind> {
        match self {
            Self::Keeper { kind, .. } => Some(kind),
            _ => None,
        }
    }
}

/// A connection to a keeper.
#[derive(Debug)]
pub struct KeeperClient {
    path: PathBuf,
    name: String,
    writer: UnixStream,
    reader: BufReader<UnixStream>,
    epoch: String,
    session: u64,
    next_id: u64,
    events: VecDeque<EventLine>,
}

impl KeeperClient {
    /// Connects and says hello.
    ///
    /// # Errors
    /// [`ClientError`].
    pub fn connect(path: &Path, name: &str) -> Result<Self, ClientError> {
        let writer = UnixStream::connect(path)?;
        verify_daemon(path, &writer)?;
        let reader = BufReader::new(writer.try_clone()?);
        let mut c = Self {
            path: path.to_owned(),
            name: name.to_owned(),
            writer,
            reader,
            epoch: String::new(),
            session: 0,
            next_id: 1,
            events: VecDeque::new(),
        };
        let hello = c.call(Request::Hello {
            pid: Some(std::process::id()),
            name: Some(name.to_owned()),
        })?;
        c.session = hello.get("session").and_then(Value::as_u64).unwrap_or(0);
        Ok(c)
    }

    /// The keeper's epoch.
    pub fn epoch(&self) -> &str {
        &self.epoch
    }

    /// This client's session number at the keeper.
    pub fn session(&self) -> u64 {
        self.session
    }

    fn read_line(&mut self) -> Result<String, ClientError> {
        let mut buf = String::new();
        let n = self
            .reader
            .by_ref()
            .take((MAX_REPLY_LINE + 1) as u64)
            .read_line(&mut buf)?;
        if n == 0 {
            return Err(ClientError::KeeperGone);
        }
        if buf.len() > MAX_REPLY_LINE {
            return Err(ClientError::Protocol(format!(
                "reply line longer than {MAX_REPLY_LINE} bytes"
            )));
        }
        Ok(buf)
    }

    fn check_epoch(&mut self, epoch: &str) -> Result<(), ClientError> {
        if self.epoch.is_empty() {
            self.epoch = epoch.to_owned();
        } else if self.epoch != epoch {
            return Err(ClientError::KeeperRestarted {
                old: self.epoch.clone(),
                new: epoch.to_owned(),
            });
        }
        Ok(())
    }

    /// Sends a request and waits for its reply (events arriving meanwhile are queued for
    /// [`KeeperClient::next_event`]).
    ///
    /// # Errors
    /// [`ClientError::Keeper`] if the keeper refused; [`ClientError::KeeperGone`] if it went.
    pub fn call(&mut self, req: Request) -> Result<Value, ClientError> {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        let line = serde_json::to_string(&Envelope { id: Some(id), req })
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let sent = self
            .writer
            .write_all(line.as_bytes())
            .and_then(|()| self.writer.write_all(b"\n"));
        if let Err(e) = sent {
            return Err(match e.kind() {
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => {
                    ClientError::KeeperGone
                }
                _ => ClientError::Io(e),
            });
        }
        loop {
            let line = self.read_line()?;
            let v: Value =
                serde_json::from_str(&line).map_err(|e| ClientError::Protocol(e.to_string()))?;
            if v.get("event").is_some() {
                let ev: EventLine =
                    serde_json::from_value(v).map_err(|e| ClientError::Protocol(e.to_string()))?;
                self.check_epoch(&ev.epoch)?;
                self.events.push_back(ev);
                continue;
            }
            let r: Reply =
                serde_json::from_value(v).map_err(|e| ClientError::Protocol(e.to_string()))?;
            self.check_epoch(&r.epoch)?;
            if r.id != Some(id) {
                return Err(ClientError::Protocol(format!(
                    "reply for {:?} while waiting for {id}",
                    r.id
                )));
            }
            return match (r.ok, r.result, r.error) {
                (true, res, _) => Ok(res.unwrap_or(Value::Null)),
                (false, _, Some(e)) => Err(ClientError::Keeper {
                    kind: e.kind,
                    message: e.message,
                }),
                (false, _, None) => Err(ClientError::Protocol("error reply without error".into())),
            };
        }
    }

    /// Waits for the next unsolicited event.
    ///
    /// # Errors
    /// [`ClientError::KeeperGone`] when the keeper closes the connection.
    pub fn next_event(&mut self) -> Result<EventLine, ClientError> {
        if let Some(e) = self.events.pop_front() {
            return Ok(e);
        }
        loop {
            let line = self.read_line()?;
            let v: Value =
                serde_json::from_str(&line).map_err(|e| ClientError::Protocol(e.to_string()))?;
            if v.get("event").is_none() {
                continue; // a stray reply
            }
            let ev: EventLine =
                serde_json::from_value(v).map_err(|e| ClientError::Protocol(e.to_string()))?;
            self.check_epoch(&ev.epoch)?;
            return Ok(ev);
        }
    }

    /// Reconnects after the keeper went away, retrying for up to `wait`. Succeeds only if the
    /// **same** keeper instance answers.
    ///
    /// # Errors
    /// [`ClientError::KeeperRestarted`] if another instance answers; [`ClientError::KeeperGone`]
    /// if none does within `wait`.
    pub fn reconnect(&mut self, wait: Duration) -> Result<(), ClientError> {
        let deadline = Instant::now() + wait;
        loop {
            match Self::connect(&self.path, &self.name) {
                Ok(new) => {
                    if new.epoch != self.epoch {
                        return Err(ClientError::KeeperRestarted {
                            old: self.epoch.clone(),
                            new: new.epoch,
                        });
                    }
                    *self = new;
                    return Ok(());
                }
                Err(ClientError::Io(_) | ClientError::KeeperGone) if Instant::now() < deadline => {
                    thread::sleep(Duration::from_millis(50));
                }
                Err(ClientError::Io(_)) => return Err(ClientError::KeeperGone),
                Err(e) => return Err(e),
            }
        }
    }
}

/// Checks that root or this user serves `path` and owns the socket file.
fn verify_daemon(path: &Path, stream: &UnixStream) -> Result<(), ClientError> {
    let me = rustix::process::geteuid().as_raw();
    let untrusted = |uid: u32| ClientError::UntrustedDaemon {
        path: path.to_owned(),
        uid,
        me,
    };
    let peer = rustix::net::sockopt::socket_peercred(stream)
        .map_err(|e| ClientError::Io(io::Error::from(e)))?
        .uid
        .as_raw();
    if peer != 0 && peer != me {
        return Err(untrusted(peer));
    }
    let owner = std::fs::symlink_metadata(path)?.uid();
    if owner != 0 && owner != me {
        return Err(untrusted(owner));
    }
    Ok(())
}
