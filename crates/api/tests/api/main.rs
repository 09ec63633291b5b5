//! The crate's integration tests, one binary (one build and link, and a model loaded once
//! per process instead of once per file).

mod requests;
mod responses;
mod responses_api;
mod validation;
