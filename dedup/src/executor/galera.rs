//! MariaDB Galera: every node takes writes, and each applies the others' commits a little
//! later. A read that decides what a caller is told (the task holding a key: `Existing`,
//! or no holder, so insert again) must see every commit the cluster made before it, or a
//! node answers with a task another node's worker already started, still `queued` here.
//! Galera's causality check (`wsrep_sync_wait`) makes a read wait until this node has
//! applied them; task-dedup sets it on those reads only (`SET STATEMENT ... FOR`, one
//! round trip), on the databases it found to be a Galera node, looked up once per
//! database ([`Executor::causal`](super::Executor)).
//!
//! What the rest needs from Galera comes from the shared mechanisms: a claim moves only
//! tasks still `queued` when its `UPDATE` applies (another node's `SKIP LOCKED` does not
//! see this node's locks), and a certification failure or a brute-force abort is a
//! deadlock (1213), which the retry driver runs again.

use std::sync::RwLock;

/// The prefix that makes a MariaDB statement a causal read on a Galera node (bit 1 of
/// `wsrep_sync_wait`: reads).
pub(crate) const CAUSAL_READ: &str = "SET STATEMENT wsrep_sync_wait = 1 FOR ";

/// The databases looked up: identity (`None`: the caller's transactions, which do not
/// tell their database), whether it is a Galera node.
static LOOKUPS: RwLock<Vec<(Option<u64>, bool)>> = RwLock::new(Vec::new());

/// Whether the database `identity` is a Galera node, if looked up.
pub(crate) fn known(identity: Option<u64>) -> Option<bool> {
    let lookups = LOOKUPS.read().ok()?;
    lookups
        .iter()
        .find(|lookup| lookup.0 == identity)
        .map(|lookup| lookup.1)
}

/// Records what the lookup of `identity` found.
pub(crate) fn record(identity: Option<u64>, galera: bool) {
    if let Ok(mut lookups) = LOOKUPS.write()
        && !lookups.iter().any(|lookup| lookup.0 == identity)
    {
        lookups.push((identity, galera));
    }
}
