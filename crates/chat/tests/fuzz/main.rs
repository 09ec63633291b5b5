//! The chat crate's fuzz targets, one binary: they need their own global allocator (one that
//! refuses any allocation an input's claimed length could make unbounded).

#[global_allocator]
static ALLOC: spindle_fuzz::CappedAlloc = spindle_fuzz::CappedAlloc;

mod templates;
mod tool_calls;
