//! The core's one use of `unsafe`: the CPU's prefetch instruction, a hint that a cache line
//! will be read soon (`LineIndex::prefetch`). On x86-64 it is `prefetcht0`; elsewhere nothing.
#![allow(unsafe_code)]

/// Starts loading the cache line of `p` into all cache levels without waiting for it.
#[cfg(all(target_arch = "x86_64", target_feature = "sse"))]
pub(super) fn prefetch(p: *const u8) {
    use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    // SAFETY: `prefetcht0` reads nothing architecturally and never faults, whatever the
    // address (a hint the CPU may drop); its one requirement, SSE, is part of the x86-64
    // baseline and enabled for this build (the `cfg` above).
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>()) }
}

/// Nothing on other targets.
#[cfg(not(all(target_arch = "x86_64", target_feature = "sse")))]
pub(super) fn prefetch(_p: *const u8) {}
