//! The core's system calls: its large tables' own memory mappings, backed by huge pages.
//! With the transports' `rt/sys.rs`, this is the only module of the crate with `unsafe`.
//!
//! With a million connections the connection table's records and indexes are ~100 MB, and
//! the remote-ID index is probed at a random place by every REQ and REP. On 4 KiB pages each
//! such probe also misses the TLB (in a virtual machine a two-dimensional page walk), which
//! costs about as much again as the cache miss. [`TableAlloc`] gives a block of [`HUGE_FROM`]
//! bytes or more a private anonymous mapping of its own (`mmap`), starting on a 2 MiB
//! boundary, and advises the kernel to back it with transparent huge pages
//! (`madvise(MADV_HUGEPAGE)`). Linux honours the advice in its default THP mode (`madvise`),
//! without any setting of the process or its C allocator, and a table's memory goes back to
//! the kernel (`munmap`) as soon as the table grows out of it. Smaller blocks are the global
//! allocator's.
//!
//! Advice that fails (a kernel without THP, or THP `never`) changes nothing but the speed:
//! the mapping is used with small pages.

#![allow(unsafe_code)]

use core::ptr::NonNull;

use allocator_api2::alloc::{AllocError, Allocator, Global, Layout};

/// The huge page size on x86-64 and arm64 (4 KiB granule).
const HUGE_PAGE: usize = 2 << 20;

/// Allocations from this size on are mapped on their own, on a huge-page boundary, and advised
/// (smaller ones would gain little and, rounded up to whole huge pages, cost memory).
pub(super) const HUGE_FROM: usize = 4 << 20;

/// The allocator of the connection table's records and indexes and of the local-QPN index:
/// the global allocator, or for a large block with `huge` its own mapping with huge-page
/// advice (see the module docs). Copies are the same allocator.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct TableAlloc {
    /// Map and advise blocks of [`HUGE_FROM`] bytes or more.
    pub(super) huge: bool,
}

impl TableAlloc {
    /// Whether a block of `layout` is mapped on its own (a pure function of `layout` and
    /// `huge`, so that `deallocate` takes the path `allocate` took).
    fn mapped(self, layout: Layout) -> bool {
        cfg!(target_os = "linux") && self.huge && layout.size() >= HUGE_FROM
    }
}

// SAFETY: a block is either `Global`'s, returned to it with the caller's layout, or a mapping
// of its own made by `map_huge` for that layout and unmapped by `unmap` with the same layout;
// `mapped` decides which from the layout alone, the same way both times. A mapping is aligned
// to a huge page, which is at least any alignment a caller asks for (`map_huge` refuses more),
// and at least `layout.size()` bytes long. Copies of a `TableAlloc` with the same `huge` are
// interchangeable; a container keeps the one it was made with.
unsafe impl Allocator for TableAlloc {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        if self.mapped(layout) {
            map_huge(layout)
        } else {
            Global.allocate(layout)
        }
    }

    fn allocate_zeroed(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        if self.mapped(layout) {
            // A new anonymous mapping reads as zeros.
            map_huge(layout)
        } else {
            Global.allocate_zeroed(layout)
        }
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        if self.mapped(layout) {
            unmap(ptr, layout);
        } else {
            // SAFETY: the caller passes a block this allocator (or a copy) returned for
            // `layout`, which `allocate` got from `Global` for the same layout.
            unsafe { Global.deallocate(ptr, layout) }
        }
    }

    unsafe fn grow(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        if !self.mapped(old) && !self.mapped(new) {
            // SAFETY: the caller's guarantees (a block of this allocator for `old`, `new` no
            // smaller), and the block is `Global`'s for `old`. `Global` reallocates in place
            // where it can (glibc: `mremap` for a block it mapped).
            return unsafe { Global.grow(ptr, old, new) };
        }
        let block = self.allocate(new)?;
        // SAFETY: `ptr` holds `old.size()` readable bytes (the caller's guarantee), the new
        // block at least `new.size() >= old.size()`, and the two are distinct live blocks;
        // then the old block, no longer used, goes back as `deallocate` requires.
        unsafe {
            core::ptr::copy_nonoverlapping(ptr.as_ptr(), block.cast::<u8>().as_ptr(), old.size());
            self.deallocate(ptr, old);
        }
        Ok(block)
    }
}

/// Bytes of the mapping of a block of `size` bytes: whole small pages.
fn mapping_len(size: usize) -> usize {
    size.next_multiple_of(4096)
}

/// A private anonymous mapping of at least `layout.size()` bytes starting on a huge-page
/// boundary, its whole huge pages advised `MADV_HUGEPAGE` (the advice's result is ignored: see
/// the module docs). The memory the kernel gives the mapping goes back to it when the block
/// is freed, whatever the C allocator keeps.
#[cfg(target_os = "linux")]
fn map_huge(layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
    if layout.align() > HUGE_PAGE {
        return Err(AllocError);
    }
    let len = mapping_len(layout.size());
    // Room to slide the start to a huge-page boundary.
    let over = len.checked_add(HUGE_PAGE).ok_or(AllocError)?;
    // SAFETY: a new private anonymous mapping at an address of the kernel's choosing: it
    // overlaps nothing that exists.
    let base = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            over,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(AllocError);
    }
    let addr = base as usize;
    let head = addr.next_multiple_of(HUGE_PAGE) - addr;
    let tail = over - head - len;
    // SAFETY: `base` is the start of the mapping of `over` bytes just made, and `head + len +
    // tail == over`: the two calls unmap its unaligned head and its unused tail (page
    // multiples both: `addr`, `HUGE_PAGE` and `len` are), nothing else, and nothing points
    // into them yet. What stays is `[addr + head, addr + head + len)`.
    unsafe {
        if head > 0 {
            libc::munmap(base, head);
        }
        if tail > 0 {
            libc::munmap(base.cast::<u8>().add(head + len).cast(), tail);
        }
    }
    let start = base.cast::<u8>().wrapping_add(head);
    let advised = len & !(HUGE_PAGE - 1);
    // SAFETY: `[start, start + advised)` lies in the mapping that stays, which nothing uses
    // yet; MADV_HUGEPAGE changes how the kernel backs its pages, not their contents.
    unsafe {
        libc::madvise(start.cast(), advised, libc::MADV_HUGEPAGE);
    }
    let start = NonNull::new(start).ok_or(AllocError)?;
    Ok(NonNull::slice_from_raw_parts(start, len))
}

#[cfg(not(target_os = "linux"))]
fn map_huge(_layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
    Err(AllocError)
}

/// Unmaps a block `map_huge` made for `layout`.
#[cfg(target_os = "linux")]
fn unmap(ptr: NonNull<u8>, layout: Layout) {
    // SAFETY: `ptr` is the start of a mapping of `mapping_len(layout.size())` bytes that
    // `map_huge` made for `layout` (`deallocate`'s caller guarantees it), and the block's
    // owner no longer uses it.
    unsafe {
        libc::munmap(ptr.as_ptr().cast(), mapping_len(layout.size()));
    }
}

#[cfg(not(target_os = "linux"))]
fn unmap(_ptr: NonNull<u8>, _layout: Layout) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_blocks_are_aligned_to_a_huge_page_and_come_back() {
        for huge in [true, false] {
            let a = TableAlloc { huge };
            let mut v: allocator_api2::vec::Vec<u64, TableAlloc> =
                allocator_api2::vec::Vec::with_capacity_in(HUGE_FROM / 8, a);
            v.resize(HUGE_FROM / 8, 7);
            if huge && cfg!(target_os = "linux") {
                assert_eq!(v.as_ptr() as usize % HUGE_PAGE, 0);
            }
            // Growing moves the contents to a new block through the same allocator.
            v.push(8);
            assert_eq!(v.len(), HUGE_FROM / 8 + 1);
            assert!(v.iter().take(HUGE_FROM / 8).all(|&x| x == 7));
            assert_eq!(v.last(), Some(&8));
            // A zeroed block reads as zeros.
            let z = allocator_api2::boxed::Box::<[u64], TableAlloc>::new_zeroed_slice_in(
                HUGE_FROM / 8,
                a,
            );
            // SAFETY: zeros are a valid `u64`.
            let z = unsafe { z.assume_init() };
            assert!(z.iter().all(|&x| x == 0));
            // Small blocks are the global allocator's as they are.
            let small: allocator_api2::vec::Vec<u8, TableAlloc> =
                allocator_api2::vec::Vec::with_capacity_in(100, a);
            assert!(small.capacity() >= 100);
        }
    }
}
