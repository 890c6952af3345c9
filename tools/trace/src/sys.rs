//! The crate's only `unsafe` code: memory advice to the kernel.
//!
//! [`huge_pages`] asks for transparent huge pages (`madvise(MADV_HUGEPAGE)`) on the
//! connection tracker's large tables. They are looked up at random positions once or more per
//! CM packet and are far larger than the TLB's reach with 4 KiB pages; with 2 MiB pages the
//! page walks mostly disappear (about a tenth of `cm-trace --json`'s CPU time on the benchmark
//! capture). Where the kernel's THP setting is `never`, or the call fails, nothing changes:
//! the advice is a hint, and the tables work the same with small pages.

/// The huge page size the advice is aligned to (x86-64 and aarch64 with 4 KiB base pages).
const HUGE: usize = 2 << 20;

/// Advises huge pages for the part of `v`'s allocation (its whole capacity) that covers
/// whole 2 MiB pages. Call it before the memory is first written (a page the process has
/// touched stays small until the kernel's background collapse): on a fresh
/// [`Vec::with_capacity`], before filling it.
pub(crate) fn huge_pages<T>(v: &mut Vec<T>) {
    let bytes = v.capacity().saturating_mul(std::mem::size_of::<T>());
    if bytes < HUGE {
        return;
    }
    let start = v.as_mut_ptr() as usize;
    let first = start.next_multiple_of(HUGE);
    let end = (start + bytes) & !(HUGE - 1);
    if end <= first {
        return;
    }
    let addr = v.as_mut_ptr().cast::<u8>().wrapping_add(first - start);
    // SAFETY: `[first, end)` lies inside `v`'s own allocation (its capacity starts at `start`
    // and is `bytes` long), which `v` holds exclusively for the call; MADV_HUGEPAGE changes
    // only how the kernel backs these pages, never their contents or their mapping, so no
    // reference into `v` observes it. A failure (THP not built in) leaves the memory as it was.
    let _ =
        unsafe { rustix::mm::madvise(addr.cast(), end - first, rustix::mm::Advice::LinuxHugepage) };
}

/// Makes room for one more element in `v`, doubling its capacity into a new allocation
/// advised as in [`huge_pages`] (what `push` would do, with the advice). For the tables that
/// grow by `push`.
pub(crate) fn reserve_huge<T>(v: &mut Vec<T>) {
    if v.len() < v.capacity() {
        return;
    }
    let mut grown = Vec::with_capacity(v.capacity().saturating_mul(2).max(16));
    huge_pages(&mut grown);
    grown.append(v);
    *v = grown;
}
