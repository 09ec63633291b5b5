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
    /// The widest copy this machine runs, or a narrower one named by `SPINDLE_ISA`
    /// (`portable`, `avx2`, `avx512`: to measure or rule out a copy). Decided once.
    pub fn best() -> Self {
        static BEST: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| {
            let widest = [Isa::Avx512, Isa::Avx2].into_iter().find(|isa| isa.runs());
            let widest = widest.unwrap_or(Isa::Portable);
            match std::env::var("SPINDLE_ISA").ok().as_deref().and_then(Isa::named) {
                Some(asked) if (asked as u8) < (widest as u8) => asked,
                _ => widest,
            }
        })
    }

    fn named(name: &str) -> Option<Self> {
        match name {
            "portable" => Some(Isa::Portable),
            "avx2" => Some(Isa::Avx2),
            "avx512" => Some(Isa::Avx512),
            _ => None,
        }
    }

    /// Every copy this machine runs, narrowest first (the tests compare them).
    #[cfg(test)]
    pub fn available() -> Vec<Self> {
        [Isa::Portable, Isa::Avx2, Isa::Avx512].into_iter().filter(|isa| isa.runs()).collect()
    }

    /// The copy of the integer dot-product kernels (K-quants, block quants) to run where this
    /// copy is the widest: their AVX-512 copy multiplies bytes with VNNI's `vpdpbusd` (and
    /// needs AVX512BW), which some AVX-512 CPUs lack; those run the AVX2 copy.
    pub fn for_integer_dots(self) -> Self {
        match self {
            Isa::Avx512 if !integer_dots_on_avx512() => Isa::Avx2,
            isa => isa,
        }
    }

    /// Every copy of the integer dot-product kernels this machine runs, narrowest first.
    #[cfg(test)]
    pub fn integer_dot_copies() -> Vec<Self> {
        let mut copies: Vec<Self> =
            Self::available().into_iter().map(Self::for_integer_dots).collect();
        copies.dedup();
        copies
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

/// Whether the integer kernels' AVX-512 copy runs here: AVX512BW and VNNI besides AVX-512F.
fn integer_dots_on_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        has!("avx512bw") && has!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}
