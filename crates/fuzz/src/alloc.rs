//! A global allocator that refuses any single allocation above a limit, so an input whose
//! length field makes the code under test reserve gigabytes fails the test at once (naming the
//! case) instead of passing on a large machine or being killed by the OOM killer on CI.

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;

use crate::CURRENT_CASE;

/// The largest single allocation a fuzzed input may cause. The targets' inputs are at most a
/// few megabytes, so anything near this size came from a length the input claimed.
pub const ALLOCATION_LIMIT: usize = 1 << 30;

/// The system allocator with [`ALLOCATION_LIMIT`] on each allocation. Declare it with
/// `#[global_allocator]` in a fuzz test binary.
pub struct CappedAlloc;

impl CappedAlloc {
    fn refuse(layout: Layout) -> *mut u8 {
        let case = CURRENT_CASE.get();
        // Straight to the file descriptor, as the process is about to abort and the test
        // harness's capture of `eprintln!` would be lost; integer formatting does not
        // allocate, so this cannot recurse.
        let _ = writeln!(
            std::io::stderr(),
            "fuzz: case {case} asked for {} bytes at once (limit {ALLOCATION_LIMIT}); \
             rerun with SPINDLE_FUZZ_CASE={case}",
            layout.size()
        );
        // A null return makes the caller report the failure and abort: the test fails.
        std::ptr::null_mut()
    }
}

// SAFETY: every call forwards to `System` unchanged, or returns null, which the `GlobalAlloc`
// contract allows for any request.
unsafe impl GlobalAlloc for CappedAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > ALLOCATION_LIMIT {
            return Self::refuse(layout);
        }
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() > ALLOCATION_LIMIT {
            return Self::refuse(layout);
        }
        System.alloc_zeroed(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > ALLOCATION_LIMIT {
            return Self::refuse(layout);
        }
        System.realloc(ptr, layout, new_size)
    }
}
