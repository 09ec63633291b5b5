//! `spindle serve` run as an operator runs it, a child process with its log in a file: what the
//! log holds, the sampling defaults the startup summary reports and requests get, and several
//! models behind one server, and the drain on SIGTERM.

mod common;
mod drain;
mod gpu;
mod kv_events_topic;
mod logs;
mod models;
mod sampling_defaults;
