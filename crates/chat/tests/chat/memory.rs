//! What a tokenizer keeps in memory: counted by this binary's allocator, per thread, so tests
//! running beside it do not count.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use spindle_chat::Tokenizer;

use crate::common;

/// The system allocator, also keeping each thread's live bytes (allocated minus freed there).
struct CountingAlloc;

thread_local! {
    static LIVE_BYTES: Cell<isize> = const { Cell::new(0) };
}

fn count(delta: isize) {
    // `try_with`: a thread being torn down has no counter left, and nothing to measure.
    let _ = LIVE_BYTES.try_with(|live| live.set(live.get() + delta));
}

// SAFETY: every call forwards to `System` unchanged; the counting touches only a thread-local
// integer (no allocation, so no recursion).
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(layout.size() as isize));
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize);
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size as isize - layout.size() as isize);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAlloc = CountingAlloc;

fn live_bytes() -> isize {
    LIVE_BYTES.with(Cell::get)
}

#[test]
fn gemma3s_262k_vocabulary_is_held_in_a_few_megabytes() {
    let header = || common::gguf_metadata("gemma3-270m", "gemma-3-270m-q4_k_m.gguf");
    drop(header()); // pulled, if this is the first test to ask
    let before = live_bytes();
    let tok = Tokenizer::from_gguf(header()).unwrap();
    let held = live_bytes() - before;
    // All on this thread: the header read, then the tokenizer built from it (which frees it).
    // The `tokenizers` crate's BPE with merges derived from the scores held 58 MB.
    eprintln!("gemma3 tokenizer: {:.1} MB", held as f64 / 1e6);
    assert!(held < 16_000_000, "the tokenizer holds {held} bytes");
    assert_eq!(tok.encode("hello world", false).unwrap().len(), 2);
}
