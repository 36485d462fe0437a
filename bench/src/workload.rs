//! Which key each call asks for.

use task_dedup::TaskKey;

use crate::args::Workload;

/// A small, fast, seedable generator: the bench needs uniform key choices, not
/// cryptographic ones.
pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> XorShift {
        XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// The key of call `seq` of `client` in `phase` ("warmup" or "run"). `round` is the race
/// round.
pub fn key(
    workload: Workload,
    phase: &str,
    client: usize,
    seq: usize,
    keys: usize,
    rng: &mut XorShift,
) -> TaskKey {
    let resource = match workload {
        // The worker workloads make their own keys (worker.rs).
        Workload::Unique
        | Workload::Worker
        | Workload::WorkerLatency
        | Workload::WorkerIdle
        | Workload::WorkerBlocked
        | Workload::Prune
        | Workload::Cost => {
            format!("{phase}-{client}-{seq}")
        }
        Workload::Dup | Workload::Churn | Workload::Replace => return hot_key(rng.below(keys)),
        Workload::Race => format!("{phase}-race-{seq}"),
        Workload::Bulk => format!("{phase}-{client}-{seq}"),
        Workload::BulkMixed if seq.is_multiple_of(2) => return hot_key(rng.below(keys)),
        Workload::BulkMixed => format!("{phase}-{client}-{seq}"),
    };
    bench_key(resource)
}

/// Hot key `index` of `dup` and `churn`, which the churn finisher completes.
pub fn hot_key(index: usize) -> TaskKey {
    bench_key(format!("hot-{index}"))
}

fn bench_key(resource: String) -> TaskKey {
    TaskKey::new("bench-user", "bench", resource).unwrap_or_else(|e| panic!("bench key: {e}"))
}
