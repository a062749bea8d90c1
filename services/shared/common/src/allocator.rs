//! The allocator of the services that hold no per-client memory bound (the
//! session store, the run coordinator) and of the bench: mimalloc, through
//! [`use_service_allocator!`](crate::use_service_allocator). The edge and
//! the all-in-one, which contains it, keep the system allocator: with
//! mimalloc a client that never reads cost the edge 43 MiB of peak RSS
//! against the 24 MiB its send budget allows (`tests/tests/slow_consumer.rs`;
//! mimalloc's arenas commit eagerly and keep what was freed, which glibc's
//! malloc returns).
//!
//! glibc's malloc was about a fifth of the coordinator's CPU samples on the
//! ACK path (`docs/benchmarks.md`, *Where the CPU goes*): every request
//! allocates and frees on one worker thread and its answer is freed on
//! another, which glibc's arenas pay for in locking and consolidation.
//! mimalloc keeps per-thread free lists with cheap cross-thread frees. Its
//! own settings are read from the environment (`MIMALLOC_*`, e.g.
//! `MIMALLOC_PURGE_DELAY`), so an operator can tune it without a build.

pub use mimalloc::MiMalloc;

/// Declares mimalloc the global allocator of the binary this is used in
/// (once, at the crate root of a `main.rs`). Libraries never set it: their
/// tests and the binaries that embed them choose.
#[macro_export]
macro_rules! use_service_allocator {
    () => {
        #[global_allocator]
        static GLOBAL_ALLOCATOR: $crate::allocator::MiMalloc = $crate::allocator::MiMalloc;
    };
}
