//! The crate's integration tests, one binary (one build and link, and a model loaded once
//! per process instead of once per file).

mod eval_mock;
mod mock_server;
mod speculation_mock;
