//! A second home for a KV pool's rows: a GPU keeps its own copy of each pool its model
//! computes in (numbered alike, so block tables and shared prefixes need no change), and the
//! host pool then holds nothing of the layers the mirror holds (all of them, or those of the
//! blocks on the device where the first blocks run on the CPU). What the host does to those
//! rows outside a model pass — a sequence taking over a partly filled shared block, the disk
//! tier saving and loading blocks — must happen there instead.

use crate::error::Result;

pub trait KvMirror: Send + Sync {
    /// Whether layer `layer`'s rows live here.
    fn holds(&self, layer: usize) -> bool;
    /// Copies the first `positions` positions of block `from` into block `to`, every layer it
    /// holds.
    fn copy_positions(&self, from: u32, to: u32, positions: usize) -> Result<()>;
    /// Block `block` of every layer it holds as
    /// [`PagedKv::read_block`](crate::PagedKv::read_block) lays out those layers.
    fn read_block(&self, block: u32) -> Result<Vec<u8>>;
    /// Overwrites block `block` of every layer it holds with `data`, laid out as `read_block`
    /// gives it (its length checked already).
    fn write_block(&self, block: u32, data: &[u8]) -> Result<()>;
}
