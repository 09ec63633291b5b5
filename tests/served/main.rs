//! `spindle serve` run as an operator runs it, a child process with its log in a file: what the
//! log holds, and the sampling defaults the startup summary reports and requests get.

mod common;
mod logs;
mod sampling_defaults;
