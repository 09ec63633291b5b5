//! Every GPU kernel against its CPU counterpart in `spindle-models`, on random shapes with ragged
//! tails, and bitwise batch invariance. They run on whatever adapter `Gpu::open` finds: Mesa's
//! lavapipe in CI. Without any adapter they skip, saying why, unless `CI` is set: there a
//! skipped kernel test would hide a broken GPU layer, so they fail.

mod attention;
mod deltanet;
mod draft_head;
mod elementwise;
mod first_blocks;
mod gemma;
mod harness;
mod hybrid;
mod matmul;
mod model;
mod moe;
mod norm_rope;
mod placement;
