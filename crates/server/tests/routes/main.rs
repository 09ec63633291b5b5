//! The routes in-process around a scripted engine: every protocol's shapes, streaming, errors,
//! cancellation, the batch API and the chat page's files, in milliseconds and without a model
//! (the real-model tests are in `tests/server`).

mod chat;
mod common;
mod endpoints;
mod errors;
mod messages;
mod models;
mod responses;
mod sampling;
mod streams;
mod web;
