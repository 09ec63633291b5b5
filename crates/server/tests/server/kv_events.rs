//! KV-cache events read by a subscriber that is not ours: pyzmq and msgpack from PyPI decode a
//! running server's events while requests run (`tests/python/kv_events_subscriber.py` says
//! what it checks): token ids per block, parents, evictions from memory, the disk tier's files,
//! a replayed missed range, and the server's own prefix-cache hits agreeing with what the events
//! say it holds.

use spindle_kv_events::{Publisher, PublisherConfig};
use spindle_runner::{DiskConfig, KvEventsOut};

use crate::common::{fresh_dir, python_with, run_python_script, start_with, Setup};

#[test]
fn a_pyzmq_subscriber_follows_the_prefix_cache_through_evictions_the_disk_tier_and_a_replay() {
    python_with("import zmq", "pyzmq>=26");
    let python = python_with("import msgpack", "msgpack>=1");
    let (publisher, bound) = Publisher::start(PublisherConfig {
        endpoint: "tcp://127.0.0.1:0".into(),
        replay_endpoint: Some("tcp://127.0.0.1:0".into()),
        replay_window: 10_000,
    })
    .unwrap();
    let base = start_with(Setup::Default, |config| {
        config.cache.events = Some(KvEventsOut::new(publisher, "test-replica"));
        // 48 blocks of the tiny model's 16 positions × 0.5 KiB: a dozen prompts overflow it.
        config.cache.kv_bytes = 48 * 16 * 512;
        config.cache.disk = Some(DiskConfig { dir: fresh_dir("kv-events-disk"), bytes: 1 << 30 });
        config.ctx_size = 512;
    });
    let replay = bound.replay_endpoint.unwrap();
    run_python_script(&python, "kv_events_subscriber.py", &[base, bound.endpoint, replay]);
}
