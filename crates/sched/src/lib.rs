//! Scheduling without tensors: the KV block pool (and, next, the prefix tree and the
//! token-budget scheduler). Everything here is plain data, tested exactly.

mod block_pool;

pub use block_pool::{BlockId, BlockPool, PoolExhausted};
