//! The PathRecord cache: keyed by (port, DGID, P_Key, SL), each entry valid for a fixed time.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ibcm_mad::sa::PathRecord;
use ibcm_mad::{Gid, Pkey, U4};

/// What a cached path is found by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CacheKey {
    /// Local port number.
    pub port: u8,
    /// Destination GID.
    pub dgid: Gid,
    /// Partition.
    pub pkey: Pkey,
    /// Service level.
    pub sl: U4,
}

/// PathRecords by [`CacheKey`], each valid for the cache's time to live from when it was
/// stored; an expired entry is never returned and is removed when looked up or by
/// [`PathCache::purge`].
#[derive(Debug, Clone)]
pub struct PathCache {
    ttl: Duration,
    map: HashMap<CacheKey, (PathRecord, Instant)>,
}

impl PathCache {
    /// An empty cache whose entries live `ttl`.
    pub fn new(ttl: Duration) -> Self {
        PathCache {
            ttl,
            map: HashMap::new(),
        }
    }

    /// Stores `rec` under `key`, valid until `now + ttl` (replacing what was there).
    pub fn insert(&mut self, key: CacheKey, rec: PathRecord, now: Instant) {
        self.map.insert(key, (rec, now + self.ttl));
    }

    /// The path under `key` if it has not expired at `now`.
    pub fn get(&mut self, key: &CacheKey, now: Instant) -> Option<PathRecord> {
        match self.map.get(key) {
            Some((rec, until)) if *until > now => Some(*rec),
            Some(_) => {
                self.map.remove(key);
                None
            }
            None => None,
        }
    }

    /// Removes every entry expired at `now`.
    pub fn purge(&mut self, now: Instant) {
        self.map.retain(|_, (_, until)| *until > now);
    }

    /// Removes every entry (an SM change, a port event).
    pub fn clear(&mut self) {
        self.map.clear();
    }

    /// Removes the entries for one port.
    pub fn clear_port(&mut self, port: u8) {
        self.map.retain(|k, _| k.port != port);
    }

    /// How many entries it holds (expired ones not yet removed included).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether it holds no entry.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}
