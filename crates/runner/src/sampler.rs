//! Sampling: written by the sampler task.
