//! Loading a model frees a lot at once: a tensor's file bytes once its tiles are built, the
//! tokenizer's intermediate tables. mimalloc keeps freed memory committed for a while before
//! it purges it (so a decode step's buffers are reused without page faults), which during a
//! load stacks those transients on top of the weights: Gemma-3-270M's peak was ~430 MiB for
//! ~380 MiB of steady need. So the load runs with purging at once, and leaves nothing behind.

use libmimalloc_sys as mi;

/// `mi_option_purge_delay` (milliseconds), which libmimalloc-sys 0.1 does not name.
const PURGE_DELAY: mi::mi_option_t = 15;

/// How long memory freed outside a load stays committed for reuse, in milliseconds. mimalloc's
/// default second let each thread's freed prefill activations stack up (SmolLM2, 8 prompts of
/// 128 at once: peak RSS ~226 MiB, ~200 MiB with this); a quarter second still spans many
/// decode steps, so a step's buffers are reused without page faults.
const STEADY_PURGE_DELAY_MS: std::ffi::c_long = 250;

/// Sets the purge delay the process runs with, unless `MIMALLOC_PURGE_DELAY` names one.
pub fn purge_freed_memory_soon() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: as in `returning_freed_memory`.
        unsafe { mi::mi_option_set(PURGE_DELAY, STEADY_PURGE_DELAY_MS) };
    }
}

/// Runs `load` with memory it frees returned to the OS at once, then returns whatever is still
/// held freed and restores the usual delay.
pub fn returning_freed_memory<T>(load: impl FnOnce() -> T) -> T {
    // SAFETY: mimalloc's option calls take plain values and may be called at any time.
    let delay = unsafe { mi::mi_option_get(PURGE_DELAY) };
    unsafe { mi::mi_option_set(PURGE_DELAY, 0) };
    let out = load();
    // SAFETY: as above; a forced collection only purges memory no live allocation uses.
    unsafe {
        mi::mi_collect(true);
        mi::mi_option_set(PURGE_DELAY, delay);
    }
    out
}

/// Hands memory held freed back to the OS now, as after an unloaded model is dropped: an idle
/// server allocates nothing that would run mimalloc's delayed purge, so gigabytes of weights
/// and KV pool would stay resident.
pub fn return_freed_memory() {
    // SAFETY: as in `returning_freed_memory`.
    unsafe { mi::mi_collect(true) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_purge_delay_is_lifted_only_during_the_load() {
        let delay = || unsafe { mi::mi_option_get(PURGE_DELAY) };
        // mimalloc's default purge delay (MIMALLOC_VERBOSE=1 lists it): the option is the one
        // named, not a neighbour.
        assert_eq!(delay(), 1000);
        let during = returning_freed_memory(|| {
            let transient = vec![1u8; 64 << 20];
            drop(std::hint::black_box(transient));
            delay()
        });
        assert_eq!((during, delay()), (0, 1000));
    }
}
