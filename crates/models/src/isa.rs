//! The instruction sets the hand-vectorized kernels have copies for, and which of them this
//! machine runs. `is_x86_feature_detected!` also checks that the OS saves the registers, so a
//! CPU that lists AVX-512 under an OS that has not enabled it gets the AVX2 copy.

/// A set of kernel copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    /// Plain Rust, on any CPU.
    Portable,
    /// AVX2 with FMA and F16C.
    Avx2,
    /// AVX-512F (with the AVX2 set).
    Avx512,
}

impl Isa {
    /// The widest copy this machine runs (the features are detected once, then cached).
    pub fn best() -> Self {
        [Isa::Avx512, Isa::Avx2].into_iter().find(|isa| isa.runs()).unwrap_or(Isa::Portable)
    }

    /// Every copy this machine runs, narrowest first (the tests compare them).
    #[cfg(test)]
    pub fn available() -> Vec<Self> {
        [Isa::Portable, Isa::Avx2, Isa::Avx512].into_iter().filter(|isa| isa.runs()).collect()
    }

    fn runs(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let avx2 = has!("avx2") && has!("fma") && has!("f16c");
            match self {
                Isa::Portable => true,
                Isa::Avx2 => avx2,
                Isa::Avx512 => avx2 && has!("avx512f"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Isa::Portable
        }
    }
}
