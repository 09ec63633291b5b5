//! A second home for a KV pool's rows: a GPU keeps its own copy of each pool its model
//! computes in (numbered alike, so block tables and shared prefixes need no change), and the
//! host pool then holds nothing. What the host does to rows outside a model pass — a sequence
//! taking over a partly filled shared block — must happen there instead.

use crate::error::Result;

pub trait KvMirror: Send + Sync {
    /// Copies the first `positions` positions of block `from` into block `to`, every layer.
    fn copy_positions(&self, from: u32, to: u32, positions: usize) -> Result<()>;
}
