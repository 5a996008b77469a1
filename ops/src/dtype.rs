//! GGUF / ggml tensor types (spec §7.4) and their block geometry.

use std::fmt;

/// A ggml tensor type as stored in a GGUF tensor directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    IQ2XXS,
    IQ2XS,
    IQ3XXS,
    IQ1S,
    IQ4NL,
    IQ3S,
    IQ2S,
    IQ4XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
}

/// (type, ggml id, name, elements per block, bytes per block)
const TABLE: &[(GgmlType, u32, &str, usize, usize)] = &[
    (GgmlType::F32, 0, "F32", 1, 4),
    (GgmlType::F16, 1, "F16", 1, 2),
    (GgmlType::Q4_0, 2, "Q4_0", 32, 18),
    (GgmlType::Q4_1, 3, "Q4_1", 32, 20),
    (GgmlType::Q5_0, 6, "Q5_0", 32, 22),
    (GgmlType::Q5_1, 7, "Q5_1", 32, 24),
    (GgmlType::Q8_0, 8, "Q8_0", 32, 34),
    (GgmlType::Q8_1, 9, "Q8_1", 32, 36),
    (GgmlType::Q2K, 10, "Q2_K", 256, 84),
    (GgmlType::Q3K, 11, "Q3_K", 256, 110),
    (GgmlType::Q4K, 12, "Q4_K", 256, 144),
    (GgmlType::Q5K, 13, "Q5_K", 256, 176),
    (GgmlType::Q6K, 14, "Q6_K", 256, 210),
    (GgmlType::Q8K, 15, "Q8_K", 256, 292),
    (GgmlType::IQ2XXS, 16, "IQ2_XXS", 256, 66),
    (GgmlType::IQ2XS, 17, "IQ2_XS", 256, 74),
    (GgmlType::IQ3XXS, 18, "IQ3_XXS", 256, 98),
    (GgmlType::IQ1S, 19, "IQ1_S", 256, 50),
    (GgmlType::IQ4NL, 20, "IQ4_NL", 32, 18),
    (GgmlType::IQ3S, 21, "IQ3_S", 256, 110),
    (GgmlType::IQ2S, 22, "IQ2_S", 256, 82),
    (GgmlType::IQ4XS, 23, "IQ4_XS", 256, 136),
    (GgmlType::I8, 24, "I8", 1, 1),
    (GgmlType::I16, 25, "I16", 1, 2),
    (GgmlType::I32, 26, "I32", 1, 4),
    (GgmlType::I64, 27, "I64", 1, 8),
    (GgmlType::F64, 28, "F64", 1, 8),
    (GgmlType::IQ1M, 29, "IQ1_M", 256, 56),
    (GgmlType::BF16, 30, "BF16", 1, 2),
    (GgmlType::TQ1_0, 34, "TQ1_0", 256, 54),
    (GgmlType::TQ2_0, 35, "TQ2_0", 256, 66),
    (GgmlType::MXFP4, 39, "MXFP4", 32, 17),
];

impl GgmlType {
    fn entry(self) -> &'static (GgmlType, u32, &'static str, usize, usize) {
        TABLE.iter().find(|e| e.0 == self).expect("every GgmlType has a table entry")
    }
    /// The type for a ggml type id, or `None` for ids nobody knows (removed ids included).
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TABLE.iter().find(|e| e.1 == id).map(|e| e.0)
    }
    pub fn id(self) -> u32 {
        self.entry().1
    }
    pub fn name(self) -> &'static str {
        self.entry().2
    }
    /// Elements per block (1 for scalar types).
    pub fn block_size(self) -> usize {
        self.entry().3
    }
    /// Bytes per block.
    pub fn type_size(self) -> usize {
        self.entry().4
    }
    /// Bytes of a row of `n` elements, or `None` if `n` is not a multiple of the block
    /// size or the size overflows.
    #[inline]
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        let bs = self.block_size();
        // every block size is a power of two: masks and shifts, not two divisions (this
        // runs in every matmul call)
        let blocks = if bs.is_power_of_two() {
            if n & (bs - 1) != 0 {
                return None;
            }
            n >> bs.trailing_zeros()
        } else {
            if !n.is_multiple_of(bs) {
                return None;
            }
            n / bs
        };
        blocks.checked_mul(self.type_size())
    }
    /// Whether pn-ops can dequantize (and so compute with) this type.
    pub fn is_supported_weight(self) -> bool {
        !matches!(
            self,
            GgmlType::Q8_1
                | GgmlType::I8
                | GgmlType::I16
                | GgmlType::I32
                | GgmlType::I64
                | GgmlType::F64
                | GgmlType::TQ1_0
                | GgmlType::TQ2_0
        )
    }
    pub fn all() -> impl Iterator<Item = GgmlType> {
        TABLE.iter().map(|e| e.0)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
