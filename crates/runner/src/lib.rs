//! Turns token ids into generated tokens: the model step, the sampler and the generation loop.

pub mod sampler;
