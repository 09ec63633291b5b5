//! The prefix cache's disk tier through the engine: snapshots written by one engine are resumed
//! by a fresh engine (a restart) on the same folder, with output identical to a cold run's bit
//! for bit; corrupt files and files of another model are ignored and cost only a prefill. Runs on
//! the real default model (SmolLM2-135M, pulled on first use) and on the tiny hybrid fixture, whose
//! recurrent state has to survive the disk too.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{engine, greedy, hybrid, run, seeded, smollm2, smollm2_files};
use spindle_runner::ModelBundle;

/// The snapshot files of `bundle`'s model under `root`.
fn snapshot_files(root: &Path, bundle: &ModelBundle) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(root.join(&bundle.fingerprint)) else { return Vec::new() };
    let paths = entries.map(|e| e.unwrap().path());
    let mut files: Vec<PathBuf> =
        paths.filter(|p| p.extension().is_some_and(|e| e == "snap")).collect();
    files.sort();
    files
}

/// Waits until the background writer has put `n` snapshot files of `bundle` under `root`.
fn wait_for_files(root: &Path, bundle: &ModelBundle, n: usize) -> Vec<PathBuf> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let files = snapshot_files(root, bundle);
        if files.len() >= n {
            assert_eq!(files.len(), n, "one file per snapshot position");
            return files;
        }
        assert!(Instant::now() < deadline, "{} of {n} snapshot files written", files.len());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A prompt of about 90 SmolLM2 tokens and two message ends inside it.
fn smollm2_prompt(bundle: &ModelBundle) -> (Vec<u32>, Vec<usize>) {
    let text = "The lighthouse keeper wrote in his log every evening. He noted the wind, the colour of \
                the sea, the ships that passed and the birds that rested on the rail. One winter the \
                lamp failed on the longest night, and he climbed the stairs with a lantern, counting \
                each step aloud so that he would not lose his place in the dark. At the top he set the \
                lantern behind the great lens, and for the rest of that night its small flame was \
                carried out across the water as far as the reef, where a fishing boat";
    let ids = bundle.tokenizer.encode(text, true).unwrap();
    assert!(ids.len() > 80, "{} tokens", ids.len());
    (ids, vec![23, 57])
}

/// The first `at` tokens of `prompt` (up to a message end), then a different turn.
fn branch(prompt: &[u32], at: usize, bundle: &ModelBundle) -> Vec<u32> {
    let mut ids = prompt[..at].to_vec();
    ids.extend(
        bundle
            .tokenizer
            .encode(" and then the morning came, grey and quiet, over the water", false)
            .unwrap(),
    );
    ids
}

#[test]
fn restart_with_the_disk_tier_hits_the_cache() {
    let bundle = smollm2();
    let root = tempfile::tempdir().unwrap();
    let (prompt, snapshots) = smollm2_prompt(&bundle);
    let cold =
        |prompt: &[u32], sampling| run(&engine(&bundle, None), prompt, &snapshots, sampling, 2048);
    let (cold_greedy, cached) = cold(&prompt, greedy());
    assert_eq!(cached, 0);
    let (cold_seeded, _) = cold(&prompt, seeded());

    // First life: a cold run that leaves a file per snapshot position (23, 57, the end).
    let first = engine(&bundle, Some(root.path()));
    assert_eq!(run(&first, &prompt, &snapshots, greedy(), 2048), (cold_greedy.clone(), 0));
    drop(first);
    wait_for_files(root.path(), &bundle, 3);

    // After a restart: the whole prompt comes from disk, logits included.
    let restarted = engine(&bundle, Some(root.path()));
    assert_eq!(run(&restarted, &prompt, &snapshots, greedy(), 2048), (cold_greedy, prompt.len()));
    assert_eq!(
        run(&engine(&bundle, Some(root.path())), &prompt, &snapshots, seeded(), 2048),
        (cold_seeded, prompt.len())
    );

    // Another prompt with the same first two messages resumes from the deeper of them.
    let other = branch(&prompt, 57, &bundle);
    let (cold_other, _) = cold(&other, greedy());
    assert_eq!(
        run(&engine(&bundle, Some(root.path())), &other, &snapshots, greedy(), 2048),
        (cold_other, 57)
    );
}

#[test]
fn a_corrupt_disk_cache_file_is_ignored() {
    let bundle = smollm2();
    let root = tempfile::tempdir().unwrap();
    let (prompt, snapshots) = smollm2_prompt(&bundle);
    let (cold, cached) =
        run(&engine(&bundle, Some(root.path())), &prompt, &snapshots, greedy(), 2048);
    assert_eq!(cached, 0);
    for path in wait_for_files(root.path(), &bundle, 3) {
        let mut bytes = std::fs::read(&path).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x01;
        std::fs::write(&path, bytes).unwrap();
    }
    // Every file is refused (and deleted): a cold run, with the cold run's output.
    assert_eq!(
        run(&engine(&bundle, Some(root.path())), &prompt, &snapshots, greedy(), 2048),
        (cold.clone(), 0)
    );
    // That run wrote sound files again, which the next start uses.
    wait_for_files(root.path(), &bundle, 3);
    assert_eq!(
        run(&engine(&bundle, Some(root.path())), &prompt, &snapshots, greedy(), 2048),
        (cold, prompt.len())
    );
}

#[test]
fn another_models_files_are_not_used() {
    let bundle = smollm2();
    let root = tempfile::tempdir().unwrap();
    let (prompt, snapshots) = smollm2_prompt(&bundle);
    let (cold, _) = run(&engine(&bundle, Some(root.path())), &prompt, &snapshots, greedy(), 2048);
    let files = wait_for_files(root.path(), &bundle, 3);
    // The same weights under another fingerprint stand in for another model of the same shape,
    // whose folder someone filled with this model's files.
    let mut other = ModelBundle::load(&smollm2_files()).unwrap();
    other.fingerprint = "0123456789abcdef0123456789abcdef".into();
    let other = Arc::new(other);
    std::fs::create_dir_all(root.path().join(&other.fingerprint)).unwrap();
    for path in &files {
        std::fs::copy(path, root.path().join(&other.fingerprint).join(path.file_name().unwrap()))
            .unwrap();
    }
    assert_eq!(
        run(&engine(&other, Some(root.path())), &prompt, &snapshots, greedy(), 2048),
        (cold, 0)
    );
    // The refused files were deleted and the run wrote its own in their place.
    for own in wait_for_files(root.path(), &other, 3) {
        let original = root.path().join(&bundle.fingerprint).join(own.file_name().unwrap());
        assert_ne!(std::fs::read(own).unwrap(), std::fs::read(original).unwrap());
    }
}

#[test]
fn a_hybrid_models_recurrent_state_survives_the_disk() {
    let bundle = hybrid();
    let root = tempfile::tempdir().unwrap();
    // Ids below the tiny model's vocabulary of 512.
    let prompt: Vec<u32> = (0..70u32).map(|i| (i * 37 + 11) % 500).collect();
    let snapshots = [20, 45];
    let cold =
        |prompt: &[u32], sampling| run(&engine(&bundle, None), prompt, &snapshots, sampling, 256);
    let (cold_greedy, _) = cold(&prompt, greedy());
    let (cold_seeded, _) = cold(&prompt, seeded());
    assert_eq!(
        run(&engine(&bundle, Some(root.path())), &prompt, &snapshots, greedy(), 256),
        (cold_greedy.clone(), 0)
    );
    wait_for_files(root.path(), &bundle, 3);
    assert_eq!(
        run(&engine(&bundle, Some(root.path())), &prompt, &snapshots, greedy(), 256),
        (cold_greedy, prompt.len())
    );
    assert_eq!(
        run(&engine(&bundle, Some(root.path())), &prompt, &snapshots, seeded(), 256),
        (cold_seeded, prompt.len())
    );
    // Resuming mid-prompt needs the recurrent state at 45, not only the keys and values.
    let mut other = prompt[..45].to_vec();
    other.extend((0..20u32).map(|i| (i * 91 + 3) % 500));
    let (cold_other, _) = cold(&other, greedy());
    assert_eq!(
        run(&engine(&bundle, Some(root.path())), &other, &snapshots, greedy(), 256),
        (cold_other, 45)
    );
}
